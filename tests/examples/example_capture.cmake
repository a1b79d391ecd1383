# run_capture(out regex what args...): runs ${PROGRAM} ${ARGS} args...; a nonzero exit, or output
# without `regex`, fails the test (`what` names what was missing); out gets the regex's first group.
# Included by the example scripts run with cmake -P.
function(run_capture out regex what)
  execute_process(COMMAND ${PROGRAM} ${ARGS} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e TIMEOUT 300)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "exit status ${rc}: ${PROGRAM} ${ARGS} ${ARGN}\n${o}${e}")
  endif()
  if(NOT "${o}${e}" MATCHES "${regex}")
    message(FATAL_ERROR "${what}: ${PROGRAM} ${ARGS} ${ARGN}\n${o}${e}")
  endif()
  set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()
