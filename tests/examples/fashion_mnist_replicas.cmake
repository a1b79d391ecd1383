# fashion_mnist as a fault-tolerant job, under partrun (examples/fashion_mnist/replicas.hpp):
# - MODE=spares: 3 slots and a spare; replica 1 SIGKILLed at step 20: the job finishes with the
#   final parameter checksum of the same job without the kill.
# - MODE=dynamic: 4 replicas, at least 3; replica 1 SIGKILLed at step 12 and a replacement started,
#   which heals in (its events in --metrics): the final test accuracy within 0.005 of the job
#   without the kill.
# - MODE=diloco: as spares, in DiLoCo's rounds of 4 batches (--sync diloco); replica 1 SIGKILLed
#   at round 5, mid-way through its local steps' round: the spare resumes slot 1's own inner
#   optimizer state, and the checksum is again the one without the kill.
# - MODE=two_kills: 4 slots and a spare, one replacement allowed; replica 1 SIGKILLed at step 10
#   (the spare takes its slot, partrun starts a replacement, which waits as a spare), then replica 2
#   at step 30 (the replacement takes that slot): the other processes never restart, and the
#   checksum is the one without the kills.
# All: every epoch reports every training example trained exactly once ("N of N").
#   cmake -DPARTRUN=partrun -DPROGRAM=fashion_mnist -DMODE=spares|dynamic|diloco|two_kills -DOUT=dir -P fashion_mnist_replicas.cmake
set(fixed_world OFF)
set(killed 1)
if(MODE STREQUAL "spares" OR MODE STREQUAL "diloco" OR MODE STREQUAL "two_kills")
  set(fixed_world ON)
  set(examples 3000)
  set(launch --standalone --nproc-per-node 3 --spares 1)
  set(kill_step 20)
  set(absorbed "1 failure\\(s\\) absorbed, 0 replacement\\(s\\) started")
  set(healers 3)  # the spare took slot 1
  if(MODE STREQUAL "diloco")
    set(rounds --sync diloco --inner-steps 4)
    set(kill_step 5)  # of 16 rounds (8 an epoch)
  elseif(MODE STREQUAL "two_kills")
    set(launch --standalone --nproc-per-node 4 --spares 1 --max-replacements 1)
    set(kill_step "1:10,2:30")  # of 48 steps (24 an epoch)
    set(killed 1 2)
    set(absorbed "2 failure\\(s\\) absorbed, 1 replacement\\(s\\) started")
    set(healers 4 1)  # the spare took slot 1, then replica 1's replacement took slot 2
  endif()
else()
  set(examples 12000)  # long enough (188 steps) for the replacement to start and join mid-run
  set(launch --standalone --nproc-per-node 4 --min-replicas 3 --max-replacements 1)
  set(kill_step 12)
  set(absorbed "1 failure\\(s\\) absorbed, 1 replacement\\(s\\) started")
endif()
set(args --limit-train ${examples} --limit-test 1000 --epochs 2 --batch-size 32 --log-every 0 ${rounds})

function(run out_var)
  execute_process(COMMAND ${PARTRUN} ${launch} ${PROGRAM} ${args} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e TIMEOUT 240)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "exit status ${rc}: partrun ${launch} fashion_mnist ${args} ${ARGN}\n${o}${e}")
  endif()
  set(text "${o}${e}")
  # Every epoch: every example trained once, counted in the steps' all-reduces.
  string(REGEX MATCHALL "epoch [0-9]/2: [0-9]+ of [0-9]+ training examples" epochs "${text}")
  list(LENGTH epochs n)
  if(NOT n EQUAL 2)
    message(FATAL_ERROR "expected 2 epoch lines, found ${n}:\n${text}")
  endif()
  foreach(line IN LISTS epochs)
    if(NOT line MATCHES ": ${examples} of ${examples} ")
      message(FATAL_ERROR "an epoch did not train every example exactly once (${line}):\n${text}")
    endif()
  endforeach()
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()
function(field text regex out_var)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "no match for '${regex}':\n${text}")
  endif()
  set(${out_var} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()

run(clean)
set(events ${OUT}/fashion_mnist_replicas_${MODE}.jsonl)
file(REMOVE ${events})
set(ENV{PARTRAIN_EXAMPLE_KILL_AT_STEP} ${kill_step})
run(faulty --metrics ${events})
unset(ENV{PARTRAIN_EXAMPLE_KILL_AT_STEP})
message("${faulty}")
foreach(r IN LISTS killed)
  if(NOT faulty MATCHES "rank ${r} \\(pid [0-9]+\\) was killed by signal SIGKILL")
    message(FATAL_ERROR "replica ${r} was not killed")
  endif()
endforeach()
if(NOT faulty MATCHES "the job finished \\(${absorbed}\\)")
  message(FATAL_ERROR "partrun did not report the absorbed failure (${absorbed})")
endif()
file(READ ${events} recorded)
if(fixed_world)
  field("${clean}" "final parameter checksum ([0-9a-f]+)" want)
  field("${faulty}" "final parameter checksum ([0-9a-f]+)" got)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "with replica(s) ${killed} lost the job ended at ${got}, without the loss at ${want}")
  endif()
  set(healed)
  foreach(r IN LISTS healers)
    list(APPEND healed "\"event\":\"healed\",\"replica\":${r}")
  endforeach()
  message(STATUS "both runs end at ${got}")
else()
  field("${clean}" "final test_accuracy ([0-9.]+)" want)
  field("${faulty}" "final test_accuracy ([0-9.]+)" got)
  # Accuracies have 4 decimals: compare them in units of 1e-4 (no leading zeros for math()).
  foreach(v got want)
    string(REPLACE "." "" ${v}_units "${${v}}")
    string(REGEX REPLACE "^0+([0-9])" "\\1" ${v}_units "${${v}_units}")
  endforeach()
  math(EXPR diff "${got_units} - ${want_units}")
  if(diff GREATER 50 OR diff LESS -50)
    message(FATAL_ERROR "test accuracy ${got} with replica 1 lost and replaced, ${want} without: more than 0.005 apart")
  endif()
  set(healed "\"event\":\"healed\",\"replica\":1")  # the replacement healed in
  message(STATUS "test accuracy ${got} (replaced) against ${want}")
endif()
foreach(h IN LISTS healed)
  string(FIND "${recorded}" "${h}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "no ${h} record in ${events}:\n${recorded}")
  endif()
endforeach()
