# packaging/package.cmake - issue 17 (docs/operating.md): the docs installed,
# and a Debian package of the tree made by CPack's DEB generator:
#   cpack -G DEB --config BUILD/CPackConfig.cmake   (or: cmake --build BUILD --target package)
# Included at the end of the top-level CMakeLists.txt, after every install().
include(GNUInstallDirs)

# README.md and docs/*.md -> share/doc/hatchkv (both cmake --install and the .deb)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
# (not the proposals and their reviews: working papers of the project, not
# documentation of what it does)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}
        FILES_MATCHING PATTERN "*.md" PATTERN "proposal-*" EXCLUDE)

# scripts/etcd-roles (docs/operating.md, "etcd with TLS and roles") -> share/hatchkv
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/etcd-roles DESTINATION ${CMAKE_INSTALL_DATADIR}/hatchkv)

# The service files name absolute paths (/usr/bin/hatchkv-server,
# /etc/hatchkv, /run/hatchkv), so they go only into the package: component
# "service", left out of a plain `cmake --install` (which must never write
# /etc or /lib of the machine it runs on).
set(HKV_PKG ${CMAKE_CURRENT_LIST_DIR})
install(FILES ${HKV_PKG}/systemd/hatchkv-server.service ${HKV_PKG}/systemd/hatchkv-memcached.service
              ${HKV_PKG}/systemd/hatchkv-member@.service
        DESTINATION /lib/systemd/system COMPONENT service EXCLUDE_FROM_ALL)
install(FILES ${HKV_PKG}/default/hatchkv-server ${HKV_PKG}/default/hatchkv-memcached
              ${HKV_PKG}/default/hatchkv-member
        DESTINATION /etc/default COMPONENT service EXCLUDE_FROM_ALL)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME hatchkv)
set(CPACK_PACKAGE_VENDOR hatchkv)
set(CPACK_PACKAGE_CONTACT "hatchkv maintainers <hatchkv@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "one-sided RDMA key-value store: server, memcached front, library")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGE_CHECKSUM SHA256)
# One package of both components: everything `cmake --install` puts
# (Unspecified) and the units and /etc/default files (service).
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL Unspecified service)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT) # hatchkv_VERSION-1_ARCH.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION database)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION [[
hatchkv-server owns a memory region registered with the NIC; clients
(libhatchkv) do every get and set themselves with RDMA Reads, Writes and
atomics, or over shared memory on one host. Also: hatchkv-memcached
(memcached's text protocol in front of it), hatchkv-admin (clusters kept
in etcd), hatchkv-bench, the header, hatchkv.pc and systemd units.]])
# The libraries' packages from the binaries themselves (dpkg-shlibdeps);
# where it is missing, Debian 12's names. Besides: the verbs providers
# (loaded with dlopen, so no shlibdeps sees them) and adduser (postinst).
find_program(HKV_DPKG_SHLIBDEPS dpkg-shlibdeps)
if(HKV_DPKG_SHLIBDEPS)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "ibverbs-providers, adduser")
else()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6, libibverbs1, librdmacm1, libevent-2.1-7, libevent-core-2.1-7, libevent-pthreads-2.1-7, libevent-extra-2.1-7, libevent-openssl-2.1-7, libssl3, libsystemd0, libsodium23, libjson-c5, ibverbs-providers, adduser")
  if(HKV_JEMALLOC)
    string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libjemalloc2")
  endif()
endif()
# /usr/share/hatchkv/etcd-roles runs etcdctl
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "etcd-client")
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON) # libhatchkv.so.0's shlibs file
# debian/triggers: ldconfig after install and removal (libhatchkv.so.0)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${HKV_PKG}/debian/postinst ${HKV_PKG}/debian/prerm ${HKV_PKG}/debian/postrm
  ${HKV_PKG}/debian/conffiles ${HKV_PKG}/debian/triggers)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON) # scripts 0755, conffiles 0644

include(CPack)
