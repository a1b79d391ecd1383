// partrain/parallel/pipeline/pipeline.hpp: pipeline parallelism, all of it. A model is a
// layer_sequence; partition_* cut it into stages; a pipeline_schedule (GPipe, 1F1B,
// interleaved, or the user's own) orders the micro-batches; pipeline_stage runs one rank.
#pragma once

#include <partrain/model/layer.hpp>
#include <partrain/parallel/pipeline/local_grid.hpp>
#include <partrain/parallel/pipeline/partition.hpp>
#include <partrain/parallel/pipeline/schedule.hpp>
#include <partrain/parallel/pipeline/stage.hpp>
