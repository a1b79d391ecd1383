# Fault-tolerant data parallelism: the quorum rule, replica_group and its lighthouse on threads,
# and (with Gloo) as processes one of which is SIGKILLed.
partrain_add_test(test_replica_group SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_replica_group.cpp LABELS "parallel;threads")
if(TARGET partrain::gloo)
  partrain_add_test(test_replica_group_gloo SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_replica_group_gloo.cpp
                    LIBS partrain::gloo LABELS "parallel;processes")
endif()
# replica_trainer, the loop over a replica_group, on threads.
partrain_add_test(test_replica_trainer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_replica_trainer.cpp LABELS "parallel;threads")
