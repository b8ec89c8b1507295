# packaging/package.cmake - issues 17 and 30 (docs/operating.md): the docs
# and man pages installed, and three Debian packages of the tree made by
# CPack's DEB generator, one per install component:
#   libhatchkv0     component lib:     libhatchkv.so.0 in /usr/lib/<triplet>
#   libhatchkv-dev  component dev:     headers, libhatchkv.so, hatchkv.pc
#   hatchkv         component hatchkv: the programs, units, /etc/default
#                   files, man pages, docs, etcd-roles
#   cpack -G DEB --config BUILD/CPackConfig.cmake   (or: cmake --build BUILD --target package)
# Included at the end of the top-level CMakeLists.txt, after every install()
# (the library's components: client/CMakeLists.txt; what names none is
# hatchkv's: CMAKE_INSTALL_DEFAULT_COMPONENT_NAME in the top-level file).
include(GNUInstallDirs)
set(HKV_PKG ${CMAKE_CURRENT_LIST_DIR})

# README.md and docs/*.md -> share/doc/hatchkv (both cmake --install and the .deb)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
# (not the proposals and their reviews: working papers of the project, not
# documentation of what it does; not docs/man/, installed below)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}
        FILES_MATCHING PATTERN "*.md" PATTERN "proposal-*" EXCLUDE PATTERN "man" EXCLUDE)

# scripts/etcd-roles (docs/operating.md, "etcd with TLS and roles") -> share/hatchkv
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/etcd-roles DESTINATION ${CMAKE_INSTALL_DATADIR}/hatchkv)

# Files gzipped -9n (no name, no time stamp: the same bytes on every build):
# the man pages (docs/man/, written from each program's --help) and the
# Debian changelog. hkv_gzip(OUT SRC) adds BUILD/packaging/OUT to hkv_pkg_files.
set(HKV_PKG_OUT ${CMAKE_BINARY_DIR}/packaging)
set(hkv_pkg_files)
function(hkv_gzip out src)
  add_custom_command(OUTPUT ${HKV_PKG_OUT}/${out}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${HKV_PKG_OUT}
    COMMAND gzip -9n -c ${src} > ${HKV_PKG_OUT}/${out}
    DEPENDS ${src} VERBATIM)
  set(hkv_pkg_files ${hkv_pkg_files} ${HKV_PKG_OUT}/${out} PARENT_SCOPE)
endfunction()
set(HKV_MAN_PAGES hatchkv-server.1 hatchkv-memcached.1 hatchkv-admin.1 hatchkv-bench.1)
foreach(m ${HKV_MAN_PAGES})
  hkv_gzip(${m}.gz ${PROJECT_SOURCE_DIR}/docs/man/${m})
  install(FILES ${HKV_PKG_OUT}/${m}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endforeach()
hkv_gzip(changelog.Debian.gz ${HKV_PKG}/debian/changelog)
add_custom_target(hkv_pkg_files ALL DEPENDS ${hkv_pkg_files})

# What only the packages hold, left out of a plain `cmake --install` (which
# must never write /etc or /lib of the machine it runs on, and has no use
# for Debian's files): EXCLUDE_FROM_ALL, installed only when CPack installs
# a component. The units and /etc/default files name absolute paths
# (/usr/bin/hatchkv-server, /etc/hatchkv, /run/hatchkv).
install(FILES ${HKV_PKG}/systemd/hatchkv-server.service ${HKV_PKG}/systemd/hatchkv-memcached.service
              ${HKV_PKG}/systemd/hatchkv-member@.service
        DESTINATION /lib/systemd/system COMPONENT hatchkv EXCLUDE_FROM_ALL)
install(FILES ${HKV_PKG}/default/hatchkv-server ${HKV_PKG}/default/hatchkv-memcached
              ${HKV_PKG}/default/hatchkv-member
        DESTINATION /etc/default COMPONENT hatchkv EXCLUDE_FROM_ALL)
# each package's copyright and changelog in /usr/share/doc/PACKAGE, and
# lintian's overrides (packaging/lintian/PACKAGE: each says why)
foreach(c lib:libhatchkv0 dev:libhatchkv-dev hatchkv:hatchkv)
  string(REPLACE ":" ";" c ${c})
  list(GET c 0 comp)
  list(GET c 1 pkg)
  install(FILES ${HKV_PKG}/debian/copyright ${HKV_PKG_OUT}/changelog.Debian.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${pkg} COMPONENT ${comp} EXCLUDE_FROM_ALL)
  if(EXISTS ${HKV_PKG}/lintian/${pkg})
    install(FILES ${HKV_PKG}/lintian/${pkg} DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/lintian/overrides
            COMPONENT ${comp} EXCLUDE_FROM_ALL)
  endif()
endforeach()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME hatchkv)
set(CPACK_PACKAGE_VENDOR hatchkv)
# (the project's own address, as in its history and debian/changelog)
set(CPACK_PACKAGE_CONTACT "hatchkv maintainers <maintainers@users.noreply.a-seed-06a1c5ba.example>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGE_CHECKSUM SHA256)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL lib dev hatchkv) # one package each
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT) # PACKAGE_VERSION-RELEASE_ARCH.deb
# debian/changelog's latest entry must name this version and release
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# No CPACK_PACKAGE_DESCRIPTION_SUMMARY: CPack would put that one line atop
# every package's description; each starts with its own.
set(hkv_about [[
hatchkv is a remote-memory key-value store: hatchkv-server owns a memory
region registered with the NIC, and clients (libhatchkv) do every get and
set themselves with RDMA Reads, Writes and atomics, or over shared memory
on one host.]])

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libhatchkv0)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIB_PACKAGE_SOURCE hatchkv)
set(CPACK_DEBIAN_LIB_DESCRIPTION "one-sided RDMA key-value store - client library
${hkv_about}
.
This package contains the shared library.")
# its shlibs file (libhatchkv 0 libhatchkv0 (>= VERSION)); ldconfig by the
# trigger, not by maintainer scripts
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA ${HKV_PKG}/debian/libhatchkv0/triggers)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libhatchkv-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_SOURCE hatchkv)
set(CPACK_DEBIAN_DEV_DESCRIPTION "one-sided RDMA key-value store - development files
${hkv_about}
.
This package contains the headers (hatchkv.h, hatchkv_err.h), the
libhatchkv.so link and hatchkv.pc: cc app.c $(pkg-config --cflags --libs
hatchkv).")
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_COMPONENT_DEV_DEPENDS lib) # -> Depends: libhatchkv0 (= VERSION-RELEASE)

set(CPACK_DEBIAN_HATCHKV_PACKAGE_NAME hatchkv)
set(CPACK_DEBIAN_HATCHKV_PACKAGE_SECTION database)
set(CPACK_DEBIAN_HATCHKV_DESCRIPTION "one-sided RDMA key-value store - servers and tools
${hkv_about}
.
This package contains hatchkv-server, hatchkv-memcached (memcached's text
protocol in front of it), hatchkv-admin (status, health and clusters kept
in etcd), hatchkv-bench (YCSB) and their systemd units. It makes the system
user hatchkv and a token; no unit is enabled or started.")
# The programs link libhatchkv statically (hatchkv_static): they need the
# libraries dpkg-shlibdeps finds in them, not libhatchkv0. Where
# dpkg-shlibdeps is missing, Debian 12's names. Besides: the verbs providers
# (loaded with dlopen, so no shlibdeps sees them) and adduser (postinst).
find_program(HKV_DPKG_SHLIBDEPS dpkg-shlibdeps)
if(HKV_DPKG_SHLIBDEPS)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
  set(CPACK_DEBIAN_HATCHKV_PACKAGE_DEPENDS "ibverbs-providers, adduser")
  set(CPACK_DEBIAN_LIB_PACKAGE_DEPENDS "ibverbs-providers")
else()
  set(hkv_deps "libc6, libibverbs1, librdmacm1, libevent-2.1-7, libevent-core-2.1-7, libevent-pthreads-2.1-7, libevent-extra-2.1-7, libevent-openssl-2.1-7, libssl3, libsystemd0, libsodium23, libjson-c5, ibverbs-providers")
  if(HKV_JEMALLOC)
    string(APPEND hkv_deps ", libjemalloc2")
  endif()
  set(CPACK_DEBIAN_HATCHKV_PACKAGE_DEPENDS "${hkv_deps}, adduser")
  set(CPACK_DEBIAN_LIB_PACKAGE_DEPENDS "${hkv_deps}")
endif()
# /usr/share/hatchkv/etcd-roles runs etcdctl
set(CPACK_DEBIAN_HATCHKV_PACKAGE_SUGGESTS "etcd-client")
set(CPACK_DEBIAN_HATCHKV_PACKAGE_CONTROL_EXTRA
  ${HKV_PKG}/debian/hatchkv/postinst ${HKV_PKG}/debian/hatchkv/prerm
  ${HKV_PKG}/debian/hatchkv/postrm ${HKV_PKG}/debian/hatchkv/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON) # scripts 0755, conffiles 0644

include(CPack)
