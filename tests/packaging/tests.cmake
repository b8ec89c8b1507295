# issue 17, "Operate it as a service" (packaging/, docs/operating.md): each
# script takes this build tree (already built: nothing is built again) and
# the source tree. Unit tier: no running systemd, no network; as root they
# also try the maintainer scripts in a private mount namespace.
#   packaging_install: cmake --install into a temporary prefix; a client
#                      built with pkg-config alone does a set/get on a shm
#                      server started from that prefix
#   packaging_deb:     cpack -G DEB: the three packages' contents,
#                      dependencies, control files, lintian; as root, dpkg
#                      installs, upgrades, removes and purges them in a
#                      throwaway overlay root
#   packaging_units:   systemd-analyze verify of the units in a scratch root,
#                      their options against --help, the env files
foreach(t install deb units)
  add_test(NAME packaging_${t}
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_${t}.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(packaging_${t} PROPERTIES LABELS unit TIMEOUT 120
                       ENVIRONMENT "HKV_SANITIZE=${HKV_SANITIZE};HKV_JEMALLOC=${HKV_JEMALLOC}")
endforeach()
# (cpack twice, lintian, dpkg five times: ~1 min on 2 cores)
set_tests_properties(packaging_deb PROPERTIES TIMEOUT 300)
