# The proof that the durability proofs work (ctest runs this with cmake -P):
# builds, in BINARY, only the two proofs and what they link, with the
# safeguards they guard removed (CAIRN_TEST_UNSAFE: synchronous=OFF, the ack
# sent before the commit), and requires each proof to fail there, for the
# reason it checks (a journal that lacks what an agent was told).
#   cmake -DSOURCE=repo -DBINARY=dir -DCXX_COMPILER=clang++-15 [-DBUILD_TYPE=RelWithDebInfo] -P unsafe_build.cmake
if(NOT BUILD_TYPE)
  set(BUILD_TYPE RelWithDebInfo)
endif()
string(TIMESTAMP started "%s")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BINARY} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
                        -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
                        "-DCAIRN_TEST_UNSAFE=no-sync;early-ack"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the unsafe build in ${BINARY} failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY} -j2 --target power_loss_test ack_order_test
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the unsafe build in ${BINARY} failed:\n${out}")
endif()
string(TIMESTAMP built "%s")
math(EXPR build_seconds "${built} - ${started}")
message(STATUS "unsafe build of the proofs: ${build_seconds} s")

# A proof's own failure names what the journal lost; anything else (a crash,
# a timeout) would not show that the proof noticed the removed safeguard.
foreach(proof power_loss_test ack_order_test)
  string(TIMESTAMP proof_started "%s")
  execute_process(COMMAND ${BINARY}/tests/engine/${proof} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
                  TIMEOUT 600)
  string(TIMESTAMP proof_ended "%s")
  math(EXPR proof_seconds "${proof_ended} - ${proof_started}")
  if(rc EQUAL 0)
    message(FATAL_ERROR "${proof} passed on a build without its safeguard: it cannot tell\n${out}")
  endif()
  # Catch wraps its lines at 80 columns, so any space may be a line break.
  if(NOT out MATCHES "is[ \t\n]+not[ \t\n]+in[ \t\n]+the[ \t\n]+journal|the[ \t\n]+journal[ \t\n]+holds|integrity\\(db\\)[ \t\n]+==[ \t\n]+\"ok\"")
    message(FATAL_ERROR "${proof} failed without the safeguard, but not because the journal lost anything:\n${out}")
  endif()
  string(FIND "${out}" "FAILED:" at)
  string(SUBSTRING "${out}" ${at} 700 evidence)
  message(STATUS "${proof} fails without its safeguard, as it must (${proof_seconds} s):\n${evidence}")
endforeach()
