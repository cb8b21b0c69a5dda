# The proof that a proof works (ctest runs this with cmake -P; registered by
# tests/CMakeLists.txt's cairn_unsafe_proof): PROOF, a test binary linked
# with a test seam that removes the one guarantee it proves, run with ARGS,
# must fail, for the reason it checks: a failure message that BECAUSE (a
# regular expression) matches.
#   cmake -DPROOF=power_loss_test_no_sync -DARGS=[acknowledged] "-DBECAUSE=is not in the journal" -P unsafe_proof.cmake
get_filename_component(name ${PROOF} NAME)
string(TIMESTAMP started "%s")
execute_process(COMMAND ${PROOF} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 600)
string(TIMESTAMP ended "%s")
math(EXPR seconds "${ended} - ${started}")
if(rc EQUAL 0)
  message(FATAL_ERROR "${name} passed without its guarantee: it cannot tell\n${out}")
endif()
# Catch wraps its lines at 80 columns, so any space may be a line break.
string(REPLACE " " "[ \t\n]+" because "${BECAUSE}")
if(NOT out MATCHES "${because}")
  message(FATAL_ERROR "${name} failed without its guarantee, but not because ${BECAUSE}:\n${out}")
endif()
string(FIND "${out}" "FAILED:" at)
string(SUBSTRING "${out}" ${at} 700 evidence)
message(STATUS "${name} fails without its guarantee, as it must (${seconds} s):\n${evidence}")
