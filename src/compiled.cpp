// src/compiled.cpp: the partrain_compiled library (CMake option PARTRAIN_COMPILED): the bodies of
// the functions that partrain/config.hpp's compiled mode leaves out of the headers, compiled once
// here with every backend this build found.
#define PARTRAIN_COMPILED_SOURCE 1

#include <partrain/comm/local.hpp>
#include <partrain/comm/process_group.hpp>
#include <partrain/launch/spawn.hpp>
#include <partrain/rendezvous/init.hpp>

#if !PARTRAIN_COMPILED
#error "src/compiled.cpp is the compiled mode's library: build it with PARTRAIN_COMPILED=1"
#endif
