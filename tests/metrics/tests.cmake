# --metrics (issue 17, "Observe"): hatchkv-server's and hatchkv-memcached's
# Prometheus pages scraped under pymemcache traffic (tests/metrics/test_metrics.py;
# it starts its servers through tests/memcached/mc_harness.py).
find_program(HKV_METRICS_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT HKV_METRICS_PYTHON)
  find_program(HKV_METRICS_PYTHON NAMES python3)
endif()

add_test(NAME metrics_pages
         COMMAND ${HKV_METRICS_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_metrics.py
                 $<TARGET_FILE:hatchkv-memcached> $<TARGET_FILE:hatchkv-server>
                 $<TARGET_FILE:hatchkv-bench>)
set_tests_properties(metrics_pages PROPERTIES LABELS unit TIMEOUT 120)

# ThreadSanitizer tier: scrapes on the accept thread while the workers count.
add_test(NAME metrics_pages_tsan
         COMMAND ${HKV_METRICS_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_metrics.py
                 $<TARGET_FILE:hatchkv-memcached> $<TARGET_FILE:hatchkv-server>)
set_tests_properties(metrics_pages_tsan PROPERTIES LABELS tsan TIMEOUT 600
                     ENVIRONMENT "TSAN_OPTIONS=halt_on_error=1 exitcode=66")

# A cluster member's page (issue 30, item 4): a replicated store of two
# members on a private etcd, each figure checked against etcd, through a
# SIGKILL, a repair and a lease lost (tests/metrics/test_cluster_metrics.py).
add_test(NAME metrics_cluster
         COMMAND ${HKV_METRICS_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_cluster_metrics.py
                 $<TARGET_FILE:hatchkv-server> $<TARGET_FILE:hatchkv-admin>)
set_tests_properties(metrics_cluster PROPERTIES LABELS unit TIMEOUT 180 SKIP_RETURN_CODE 77)
# ThreadSanitizer tier: scrapes on the event loop while the coordination and
# keepalive threads publish (a report makes the server exit 66: the test fails).
add_test(NAME metrics_cluster_tsan
         COMMAND ${HKV_METRICS_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_cluster_metrics.py
                 $<TARGET_FILE:hatchkv-server> $<TARGET_FILE:hatchkv-admin>)
set_tests_properties(metrics_cluster_tsan PROPERTIES LABELS tsan TIMEOUT 600 SKIP_RETURN_CODE 77
                     ENVIRONMENT "TSAN_OPTIONS=halt_on_error=1 exitcode=66")

# docs/alerts.yml: promtool check rules, the metrics it names documented,
# and promtool test rules with tests/metrics/alerts_test.yml (skipped without
# promtool: Debian's prometheus package).
add_test(NAME metrics_alerts
         COMMAND ${HKV_METRICS_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_alerts.py)
set_tests_properties(metrics_alerts PROPERTIES LABELS unit TIMEOUT 60 SKIP_RETURN_CODE 77)

# A store move's copy watched while it runs (issue 30: moves and repairs in
# progress with bytes done): a's page answered mid-copy with 0 < done <
# total, hatchkv-admin status --json listing the copy, all gone after
# (tests/metrics/test_move_progress.py; ~60 MB loaded with hatchkv-bench).
add_test(NAME metrics_move_progress
         COMMAND ${HKV_METRICS_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_move_progress.py
                 $<TARGET_FILE:hatchkv-server> $<TARGET_FILE:hatchkv-admin>
                 $<TARGET_FILE:hatchkv-bench>)
set_tests_properties(metrics_move_progress PROPERTIES LABELS unit TIMEOUT 180
                     SKIP_RETURN_CODE 77)
# ThreadSanitizer tier: the loop's slices, scrapes and the cluster thread's
# publication of the progress race-free.
add_test(NAME metrics_move_progress_tsan
         COMMAND ${HKV_METRICS_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_move_progress.py
                 $<TARGET_FILE:hatchkv-server> $<TARGET_FILE:hatchkv-admin>
                 $<TARGET_FILE:hatchkv-bench>)
set_tests_properties(metrics_move_progress_tsan PROPERTIES LABELS tsan TIMEOUT 600
                     SKIP_RETURN_CODE 77 ENVIRONMENT "TSAN_OPTIONS=halt_on_error=1 exitcode=66")
