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
