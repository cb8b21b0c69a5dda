# cmake -DIN=executable -P no_relocations.cmake: fails when the freestanding
# launcher has a dynamic relocation or an interpreter (see ../CMakeLists.txt).
execute_process(COMMAND readelf --dyn-syms --relocs --program-headers "${IN}" OUTPUT_VARIABLE listing RESULT_VARIABLE code)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "readelf could not read ${IN}")
endif()
if(listing MATCHES "Relocation section" OR listing MATCHES "INTERP")
  message(FATAL_ERROR "${IN} has relocations or an interpreter, which nothing would apply or run:\n${listing}")
endif()
