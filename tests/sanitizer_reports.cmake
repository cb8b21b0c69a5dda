# cmake -DDIR=FOLDER [-DCLEAR=ON] -P sanitizer_reports.cmake: with CLEAR, empties
# FOLDER, where the sanitizers write their reports (tests/sanitized.cmake);
# without, shows every report in it and fails if there is one.
if(CLEAR)
  file(REMOVE_RECURSE ${DIR})
  file(MAKE_DIRECTORY ${DIR})
  return()
endif()
file(GLOB reports ${DIR}/report.*)
if(NOT reports)
  return()
endif()
foreach(report ${reports})
  file(READ ${report} text)
  message("${report}:\n${text}")
endforeach()
list(LENGTH reports count)
message(FATAL_ERROR "${count} sanitizer report(s) in ${DIR}")
