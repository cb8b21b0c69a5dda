# The ctests `make test-sanitize` runs in an instrumented build (CAIRN_SANITIZE;
# cmake/instrument.cmake), labelled `sanitized`, and the target `sanitized`
# that builds what they need. The host's code is instrumented, the agents are
# not, so the sandboxed cases work as they do in `make test`.
#
# address,undefined: the protocol, the journal on both backends, the tools,
# the runtime (cold sandboxes, and the [serial] cases; the pooled,
# started-ahead and normal-user runs repeat its cases), the engine, the
# ledger (its group commit and the run state it keeps), the attacks on
# the host and the deterministic simulator (300 of its seeds, and 100 with
# the real attempt driver). Every suite would run here; left to `make test` for
# their cost are those that drive the cairn command as a black box (cli,
# daemon, crash, chaos, durability proofs), which the ones above cover from
# inside, and the VM.
#
# thread: what runs the engine's threads: the event loop, the ledger's group
# commit across live runs, the scheduler and the broker (engine_test, in
# process), the ledger's committer thread and its writers (ledger_test), the
# ledger's acknowledgements against host deaths (ack_order_test),
# `cairn serve` with many runs and workers (daemon_test), and the runtime's
# own threads under them: the warm pool's, the output pump (runtime_test).
set(reports ${CMAKE_BINARY_DIR}/sanitizer-reports)
find_program(CAIRN_LLVM_SYMBOLIZER NAMES llvm-symbolizer-15 llvm-symbolizer)
set(report_options "log_path=${reports}/report")
if(CAIRN_LLVM_SYMBOLIZER)
  string(APPEND report_options ":external_symbolizer_path=${CAIRN_LLVM_SYMBOLIZER}")
endif()
add_custom_target(sanitized)
add_dependencies(sanitized cairn_python_sdk)

# sanitized_test(NAME TARGET [ARG...]): a ctest that runs TARGET with the ARGs
# as the ctest of that name in `make test` does, its reports kept.
function(sanitized_test name target)
  add_test(NAME sanitized_${name} COMMAND ${target} ${ARGN} WORKING_DIRECTORY $<TARGET_FILE_DIR:${target}>)
  set_tests_properties(sanitized_${name} PROPERTIES LABELS sanitized FIXTURES_REQUIRED sanitizers ENVIRONMENT
    "ASAN_OPTIONS=${report_options};UBSAN_OPTIONS=${report_options}:print_stacktrace=1;TSAN_OPTIONS=${report_options}:second_deadlock_stack=1")
  add_dependencies(sanitized ${target})
endfunction()

if(CAIRN_SANITIZE MATCHES "thread")
  sanitized_test(engine_test engine_test)
  sanitized_test(ledger_test ledger_test)
  sanitized_test(ack_order_test ack_order_test)
  sanitized_test(daemon_test daemon_test "~[postgres]")
  sanitized_test(runtime_test runtime_test "~[serial]")
else()
  sanitized_test(protocol_test protocol_test)
  sanitized_test(storage_test storage_test)
  sanitized_test(tools_test tools_test)
  sanitized_test(runtime_test runtime_test "~[serial]")
  sanitized_test(runtime_test_serial runtime_test "[serial]")
  set_tests_properties(sanitized_runtime_test_serial PROPERTIES RUN_SERIAL TRUE)
  sanitized_test(engine_test engine_test)
  sanitized_test(ledger_test ledger_test)
  sanitized_test(host_test host_test)
  sanitized_test(sim sim --seeds 300 --twice)
  sanitized_test(sim_real_driver sim --driver real --seeds 100 --twice)
endif()

# Every report of every instrumented process (the cairn commands a test runs
# included, whose own exit status a test may not look at) goes to a file in
# sanitizer-reports/; the test sanitizer_reports, run after the others, fails
# when there is one, and shows it.
add_test(NAME sanitizer_reports_cleared COMMAND ${CMAKE_COMMAND} -DDIR=${reports} -DCLEAR=ON
         -P ${CMAKE_CURRENT_SOURCE_DIR}/sanitizer_reports.cmake)
add_test(NAME sanitizer_reports COMMAND ${CMAKE_COMMAND} -DDIR=${reports}
         -P ${CMAKE_CURRENT_SOURCE_DIR}/sanitizer_reports.cmake)
set_tests_properties(sanitizer_reports_cleared PROPERTIES FIXTURES_SETUP sanitizers)
set_tests_properties(sanitizer_reports PROPERTIES FIXTURES_CLEANUP sanitizers)
