# Sanitizers and fuzzing, each in a build folder of its own (make test-sanitize, make fuzz):
#   CAIRN_SANITIZE  the kinds of -fsanitize= the host's code is built with: address,undefined or thread
#   CAIRN_FUZZ      the libFuzzer targets of tests/fuzz (clang only), which adds libFuzzer's coverage
#                   to the code it fuzzes
# Both leave plain what runs inside a sandbox, which cairn_in_sandbox() marks: an agent is the
# untrusted side, bounded by its sandbox rather than checked, and an instrumented one would not run
# there (the SDK links agents as static-pie, which carries no sanitizer runtime; without a cgroup
# RLIMIT_AS counts ASan's reserved shadow memory; the pooled sandboxes' launcher has no C library).
set(CAIRN_SANITIZE "" CACHE STRING "Sanitizers for the host's code, as -fsanitize= takes them (address,undefined or thread)")
option(CAIRN_FUZZ "Build the libFuzzer targets of tests/fuzz (clang only)" OFF)

set(cairn_instrumented OFF)
if(CAIRN_SANITIZE OR CAIRN_FUZZ)
  set(cairn_instrumented ON)
endif()
if(CAIRN_SANITIZE)
  # Frame pointers for the reports' stacks; no recovery, so that a finding fails its test.
  add_compile_options(-fsanitize=${CAIRN_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
endif()
set(cairn_link_sanitizers ${CAIRN_SANITIZE})
if(CAIRN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "CAIRN_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++-15")
  endif()
  # What the coverage calls in the fuzzed code (in libraries every program links) need.
  list(APPEND cairn_link_sanitizers fuzzer-no-link)
endif()
list(JOIN cairn_link_sanitizers "," cairn_link_sanitizers)
if(cairn_link_sanitizers)
  add_link_options(-fsanitize=${cairn_link_sanitizers})
endif()

# cairn_in_sandbox(TARGET [SCOPE]): TARGET runs inside a sandbox (or, with SCOPE PUBLIC, is linked into
# what does): built without the instrumentation above.
function(cairn_in_sandbox target)
  set(scope ${ARGV1})
  if(NOT scope)
    set(scope PRIVATE)
  endif()
  if(cairn_instrumented)
    target_compile_options(${target} ${scope} $<BUILD_INTERFACE:-fno-sanitize=all>)
    target_link_options(${target} ${scope} $<BUILD_INTERFACE:-fno-sanitize=all>)
  endif()
endfunction()
