# The proof that the durability proofs work (ctest runs this with cmake -P):
# each proof, linked with the safeguard it guards removed (tests/engine's
# CMakeLists: cairn_storage_unsafe never syncs, cairn_engine_unsafe acks a
# step before its commit), must fail, for the reason it checks: a journal
# that lacks what an agent was told.
#   cmake -DPOWER_LOSS_TEST=power_loss_test_unsafe -DACK_ORDER_TEST=ack_order_test_unsafe -P unsafe_proofs.cmake
foreach(proof ${POWER_LOSS_TEST} ${ACK_ORDER_TEST})
  get_filename_component(name ${proof} NAME)
  string(TIMESTAMP started "%s")
  execute_process(COMMAND ${proof} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 600)
  string(TIMESTAMP ended "%s")
  math(EXPR seconds "${ended} - ${started}")
  if(rc EQUAL 0)
    message(FATAL_ERROR "${name} passed without its safeguard: it cannot tell\n${out}")
  endif()
  # Catch wraps its lines at 80 columns, so any space may be a line break.
  if(NOT out MATCHES "is[ \t\n]+not[ \t\n]+in[ \t\n]+the[ \t\n]+journal|the[ \t\n]+journal[ \t\n]+holds|integrity\\(db\\)[ \t\n]+==[ \t\n]+\"ok\"")
    message(FATAL_ERROR "${name} failed without its safeguard, but not because the journal lost anything:\n${out}")
  endif()
  string(FIND "${out}" "FAILED:" at)
  string(SUBSTRING "${out}" ${at} 700 evidence)
  message(STATUS "${name} fails without its safeguard, as it must (${seconds} s):\n${evidence}")
endforeach()
