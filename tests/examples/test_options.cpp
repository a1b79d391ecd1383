// The example's command line: defaults, every option, and clear errors for bad input.
#include <catch2/catch.hpp>

#include "options.hpp"

using example::parse_options;
using example::usage_error;

TEST_CASE("example options: defaults and values", "[examples][options]") {
  const auto d = parse_options({});
  CHECK(d.device == "cpu");
  CHECK(d.backend == "gloo");
  CHECK(d.nproc == 0);
  CHECK(d.loop == "ranges");
  const auto o = parse_options({"--backend", "local", "--nproc", "4", "--epochs", "3", "--batch-size", "32", "--lr",
                                "0.1", "--seed", "9", "--checkpoint", "/tmp/c", "--metrics", "m.jsonl", "--data", "/d",
                                "--limit-train", "100", "--limit-test", "50", "--loop", "coroutine", "--no-overlap"});
  CHECK(o.backend == "local");
  CHECK(o.nproc == 4);
  CHECK(o.epochs == 3);
  CHECK(o.batch_size == 32);
  CHECK(o.lr == 0.1);
  CHECK(o.seed == 9);
  CHECK(o.checkpoint == "/tmp/c");
  CHECK(o.metrics == "m.jsonl");
  CHECK(o.data == "/d");
  CHECK(o.limit_train == 100);
  CHECK(o.limit_test == 50);
  CHECK(o.loop == "coroutine");
  CHECK_FALSE(o.overlap);
  CHECK(parse_options({"--backend", "local"}).nproc == 1);  // local without --nproc: one thread
  CHECK(d.local_collectives == "inline");
  CHECK(parse_options({"--backend", "local", "--local-collectives", "worker"}).local_collectives == "worker");
  CHECK_THROWS_WITH(parse_options({"--local-collectives", "thread"}), Catch::Contains("--local-collectives") &&
                                                                         Catch::Contains("inline"));
}

TEST_CASE("example options: batches prefetched, none by default for a rank on one CPU", "[examples][options]") {
  const auto d = parse_options({});
  CHECK(example::prefetch_batches(d, 1) == 0);  // pinned: a loader thread would take turns with it
  CHECK(example::prefetch_batches(d, 2) == 2);
  CHECK(example::prefetch_batches(d, 0) == 2);  // mask unknown
  CHECK(example::prefetch_batches(parse_options({"--prefetch", "3"}), 1) == 3);
  CHECK(example::prefetch_batches(parse_options({"--prefetch", "0"}), 16) == 0);
  CHECK_THROWS_WITH(parse_options({"--prefetch", "65"}), Catch::Contains("--prefetch: must be between 0 and 64, got 65"));
  CHECK_THROWS_WITH(parse_options({"--prefetch", "-1"}), Catch::Contains("--prefetch"));
  CHECK_THROWS_WITH(parse_options({"--prefetch", "two"}), Catch::Contains("'two' is not a valid"));
}

TEST_CASE("example options: timeline and bucket size", "[examples][options]") {
  const auto d = parse_options({});
  CHECK(d.trace.empty());  // off unless --trace or PARTRAIN_TRACE
  CHECK(d.bucket_kb == 0);  // DDP's defaults
  const auto o = parse_options({"--trace", "t.json", "--bucket-kb", "64"});
  CHECK(o.trace == "t.json");
  CHECK(o.bucket_kb == 64);
  CHECK_THROWS_WITH(parse_options({"--trace"}), Catch::Contains("--trace: needs a value"));
  CHECK_THROWS_WITH(parse_options({"--bucket-kb", "0"}), Catch::Contains("--bucket-kb: must be greater than 0"));
}

TEST_CASE("example options: bad input names the flag and what was expected", "[examples][options]") {
  CHECK_THROWS_WITH(parse_options({"--epochs"}), Catch::Contains("--epochs: needs a value"));
  CHECK_THROWS_WITH(parse_options({"--epochs", "0"}), Catch::Contains("--epochs: must be greater than 0"));
  CHECK_THROWS_WITH(parse_options({"--batch-size", "12x"}), Catch::Contains("'12x' is not a valid"));
  CHECK_THROWS_WITH(parse_options({"--lr", "-1"}), Catch::Contains("--lr: must be greater than 0"));
  CHECK_THROWS_WITH(parse_options({"--device", "tpu"}), Catch::Contains("'tpu' is not one of: cpu, cuda"));
  CHECK_THROWS_WITH(parse_options({"--backend", "mpl"}), Catch::Contains("not one of: gloo, mpi, nccl, local"));
  CHECK_THROWS_WITH(parse_options({"--backend", "mpi", "--nproc", "2"}),
                    Catch::Contains("mpirun or srun starts the ranks") && Catch::Contains("mpirun -np 2"));
  CHECK(parse_options({"--backend", "mpi"}).backend == "mpi");
  CHECK_THROWS_WITH(parse_options({"--sync", "diloco", "--parallel", "zero2"}), Catch::Contains("needs --parallel ddp"));
  CHECK(parse_options({"--sync", "local-sgd", "--checkpoint", "d"}).checkpoint == "d");  // rank checkpoints
  CHECK(parse_options({"--parallel", "fsdp", "--checkpoint", "d"}).checkpoint == "d");  // sharded checkpoints
  CHECK_THROWS_WITH(parse_options({"--parallel", "dp", "--checkpoint", "d"}),
                    Catch::Contains("supported with --parallel ddp, zero1, zero2, fsdp and pipeline (not dp)"));
  CHECK_THROWS_WITH(parse_options({"--outer-bits", "4"}), Catch::Contains("not one of: 32, 16, 8"));
  CHECK_THROWS_WITH(parse_options({"--warmup-steps", "-3"}), Catch::Contains("must be >= 0"));
  CHECK_THROWS_WITH(parse_options({"--parallel", "zero2", "--precision", "fp16", "--reduce-16bit"}),
                    Catch::Contains("ZeRO reduces in fp32"));
  CHECK(parse_options({"--sync", "diloco", "--inner-steps", "20", "--outer-bits", "8"}).outer_bits == 8);
  CHECK(parse_options({"--parallel", "zero1", "--checkpoint", "d"}).parallel == "zero1");
  CHECK_THROWS_WITH(parse_options({"--backend", "nccl"}), Catch::Contains("needs --device cuda"));
  CHECK_THROWS_WITH(parse_options({"--parallel", "dp", "--nproc", "2"}), Catch::Contains("use --parallel ddp"));
  CHECK_THROWS_WITH(parse_options({"--parallel", "pipeline", "--stages", "2", "--nproc", "3"}),
                    Catch::Contains("must be a multiple of --stages 2"));
  CHECK(parse_options({"--parallel", "pipeline", "--stages", "2", "--nproc", "4"}).nproc == 4);  // 2 replicas
  CHECK(parse_options({"--parallel", "pipeline", "--nproc", "4", "--checkpoint", "d"}).checkpoint == "d");  // a section per rank
  CHECK(parse_options({"--parallel", "pipeline", "--checkpoint", "d"}).checkpoint == "d");  // stage by stage
  CHECK(parse_options({"--model", "cnn", "--parallel", "fsdp", "--precision", "bf16"}).model == "cnn");
  CHECK_THROWS_WITH(parse_options({"--model", "transformer"}), Catch::Contains("not one of: mlp, cnn, vit"));
  CHECK_THROWS_WITH(parse_options({"--model"}), Catch::Contains("--model: needs a value"));
  CHECK_THROWS_WITH(parse_options({"--model", "cnn", "--device", "cuda"}), Catch::Contains("runs on the host"));
  CHECK_THROWS_WITH(parse_options({"--model", "cnn", "--precision", "fp16"}), Catch::Contains("CNN computes in fp32"));
  // Options a mode never reads, and empty paths, are refused rather than ignored.
  CHECK_THROWS_WITH(parse_options({"--devices", "3"}), Catch::Contains("--devices: this run (--parallel ddp") &&
                                                           Catch::Contains("it is for --parallel dp"));
  CHECK_THROWS_WITH(parse_options({"--stages", "2"}), Catch::Contains("it is for --parallel pipeline"));
  CHECK_THROWS_WITH(parse_options({"--parallel", "zero1", "--schedule", "gpipe"}), Catch::Contains("--schedule: this run"));
  CHECK_THROWS_WITH(parse_options({"--period", "4"}), Catch::Contains("it is for --sync local-sgd"));
  CHECK_THROWS_WITH(parse_options({"--parallel", "pipeline", "--bucket-kb", "64"}), Catch::Contains("--bucket-kb: this run"));
  CHECK_THROWS_WITH(parse_options({"--local-collectives", "worker"}), Catch::Contains("it is for --backend local"));
  CHECK_THROWS_WITH(parse_options({"--outer-lr", "0.5"}), Catch::Contains("it is for --sync diloco"));
  CHECK(parse_options({"--parallel", "dp", "--devices", "3"}).devices == 3);
  CHECK(parse_options({"--parallel", "zero2", "--bucket-kb", "64", "--no-overlap"}).bucket_kb == 64);
  CHECK_THROWS_WITH(parse_options({"--checkpoint", ""}), Catch::Contains("--checkpoint: needs a non-empty path"));
  CHECK_THROWS_WITH(parse_options({"--metrics", ""}), Catch::Contains("--metrics: needs a non-empty path"));
  CHECK_THROWS_WITH(parse_options({"--data", ""}), Catch::Contains("--data: needs a non-empty path"));
  // --tp: the ViT under DDP on the host, and none of the options that need whole blocks.
  CHECK(parse_options({"--model", "vit", "--tp", "2"}).tp == 2);
  CHECK(parse_options({"--model", "vit", "--tp", "1"}).tp == 1);
  CHECK_THROWS_WITH(parse_options({"--tp", "1"}), Catch::Contains("--tp: this run") &&
                                                   Catch::Contains("--model vit with --parallel ddp"));
  CHECK_THROWS_WITH(parse_options({"--tp", "2"}), Catch::Contains("splits the ViT's blocks"));
  CHECK(parse_options({"--model", "vit", "--tp", "2", "--parallel", "fsdp"}).parallel == "fsdp");
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--tp", "2", "--sync", "diloco"}),
                    Catch::Contains("--tp: with DDP, ZeRO or FSDP over the data-parallel dimension"));
  CHECK(parse_options({"--model", "vit", "--tp", "2", "--parallel", "zero2"}).parallel == "zero2");
  // bf16: the tensor-parallel collectives in bf16, under every mode (fp16 is refused).
  CHECK(parse_options({"--model", "vit", "--tp", "2", "--precision", "bf16"}).precision == "bf16");
  CHECK(parse_options({"--model", "vit", "--tp", "2", "--precision", "bf16", "--parallel", "pipeline", "--nproc", "4"}).tp == 2);
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--tp", "2", "--precision", "fp16"}),
                    Catch::Contains("--precision fp32 or bf16"));
  // The ViT takes bf16 everywhere mixed precision runs (its matrix products in bf16); fp16 only as
  // FSDP's 16-bit gathers.
  CHECK(parse_options({"--model", "vit", "--precision", "bf16"}).precision == "bf16");
  CHECK(parse_options({"--model", "vit", "--precision", "bf16", "--parallel", "zero2"}).parallel == "zero2");
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--precision", "fp16"}), Catch::Contains("ViT computes in fp32"));
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--precision", "bf16", "--parallel", "dp"}),
                    Catch::Contains("mixed precision runs with"));
  CHECK(parse_options({"--model", "vit", "--tp", "2", "--parallel", "zero1", "--checkpoint", "d"}).checkpoint == "d");
  CHECK(parse_options({"--model", "vit", "--tp", "2", "--parallel", "fsdp", "--checkpoint", "d"}).checkpoint == "d");
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--tp", "2", "--recompute", "full"}), Catch::Contains("--tp: not yet with"));
  CHECK(parse_options({"--model", "vit", "--tp", "2", "--export", "w.safetensors"}).export_to == "w.safetensors");
  CHECK(parse_options({"--model", "vit", "--tp", "2", "--parallel", "fsdp", "--export", "w.safetensors"}).parallel == "fsdp");
  // --tp with pipeline stages: tp ranks per stage, no checkpoint yet.
  const auto pp_tp = parse_options({"--model", "vit", "--tp", "2", "--parallel", "pipeline", "--stages", "2", "--backend", "local"});
  CHECK(pp_tp.nproc == 4);
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--tp", "2", "--parallel", "pipeline", "--nproc", "2"}),
                    Catch::Contains("--nproc 2 must be a multiple of --stages 2 x --tp 2 (2 ranks per stage)"));
  CHECK(parse_options({"--model", "vit", "--tp", "2", "--parallel", "pipeline", "--nproc", "8"}).nproc == 8);  // 3D
  CHECK(parse_options({"--model", "vit", "--tp", "2", "--sequence-parallel"}).sequence_parallel);
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--sequence-parallel"}), Catch::Contains("it is for --tp N above 1"));
  CHECK(parse_options({"--model", "vit", "--tp", "2", "--parallel", "pipeline", "--checkpoint", "d"}).checkpoint == "d");
  // --deterministic: data parallel on the host in fp32, a global batch its shards divide.
  CHECK(parse_options({"--deterministic", "4"}).deterministic == 4);
  CHECK(parse_options({"--deterministic", "4", "--batch-size", "32", "--accumulate", "2"}).accumulate == 2);
  CHECK_THROWS_WITH(parse_options({"--deterministic", "4", "--accumulate", "3"}),
                    Catch::Contains("the batches a step must divide the shards"));
  CHECK_THROWS_WITH(parse_options({"--deterministic", "4", "--batch-size", "3", "--accumulate", "2"}),
                    Catch::Contains("--batch-size x --accumulate is the global batch, and a batch of 3 rows does not split into 2"));
  CHECK_THROWS_WITH(parse_options({"--accumulate", "2", "--sync", "diloco"}), Catch::Contains("--accumulate: this run"));
  CHECK_THROWS_WITH(parse_options({"--accumulate", "0"}), Catch::Contains("--accumulate"));
  CHECK(parse_options({"--deterministic", "4", "--parallel", "zero1"}).parallel == "zero1");  // the state sharded
  CHECK(parse_options({"--deterministic", "4", "--parallel", "zero2", "--bucket-kb", "64"}).bucket_kb == 64);
  CHECK_THROWS_WITH(parse_options({"--deterministic", "4", "--parallel", "zero1", "--bucket-kb", "64"}),
                    Catch::Contains("--bucket-kb"));
  CHECK(parse_options({"--deterministic", "4", "--parallel", "fsdp"}).parallel == "fsdp");  // the layers sharded
  CHECK_THROWS_WITH(parse_options({"--deterministic", "4", "--parallel", "pipeline"}),
                    Catch::Contains("--deterministic: data parallel on the host in fp32 only (--parallel ddp, zero1, zero2 or fsdp"));
  CHECK_THROWS_WITH(parse_options({"--deterministic", "7"}), Catch::Contains("a batch of 64 rows does not split into 7 equal shards"));
  CHECK_THROWS_WITH(parse_options({"--deterministic", "0"}), Catch::Contains("--deterministic"));
  // The CUDA ViT trains under fsdp over NCCL, and nowhere else.
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--device", "cuda"}), Catch::Contains("with --parallel fsdp (got --parallel ddp)"));
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--device", "cuda", "--parallel", "fsdp"}),
                    Catch::Contains("use --backend nccl (got gloo)"));
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--device", "cuda", "--parallel", "fsdp", "--backend", "nccl",
                                   "--recompute", "full"}),
                    Catch::Contains("the CUDA ViT keeps its activations"));
  CHECK(parse_options({"--model", "vit", "--device", "cuda", "--parallel", "fsdp", "--backend", "nccl", "--precision", "bf16"})
            .device == "cuda");
  CHECK_THROWS_WITH(parse_options({"--device", "cuda", "--parallel", "fsdp", "--backend", "nccl"}),
                    Catch::Contains("--parallel fsdp: this example runs it on the host"));
  // The ViT's defaults: AdamW at 1e-3 with 200 warm-up steps; the others keep SGD at 0.05.
  const auto vit = parse_options({"--model", "vit"});
  CHECK((vit.optimizer == "adamw" && vit.lr == 1e-3 && vit.lr_warmup == 200));
  const auto mlp = parse_options({});
  CHECK((mlp.optimizer == "sgd" && mlp.lr == 0.05 && mlp.lr_warmup == 0));
  CHECK(parse_options({"--model", "vit", "--lr", "0.002", "--optimizer", "sgd"}).lr == 0.002);
  CHECK(parse_options({"--optimizer", "adamw"}).lr == 1e-3);
  CHECK_THROWS_WITH(parse_options({"--optimizer", "lion"}), Catch::Contains("not one of: sgd, adamw"));
  CHECK(parse_options({"--model", "vit", "--recompute", "every:2"}).recompute == "every:2");
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--recompute", "every:0"}), Catch::Contains("none, full, every:K"));
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--recompute", "some"}), Catch::Contains("none, full, every:K"));
  CHECK_THROWS_WITH(parse_options({"--recompute", "full"}), Catch::Contains("the MLP's layers keep no activations"));
  CHECK_THROWS_WITH(parse_options({"--model", "cnn", "--recompute", "full"}),
                    Catch::Contains("the CNN's layers keep no activations"));
  // An optimizer's option given to the other optimizer is refused, not ignored.
  CHECK_THROWS_WITH(parse_options({"--model", "vit", "--momentum", "0.5"}), Catch::Contains("--momentum: adamw does not read it"));
  CHECK_THROWS_WITH(parse_options({"--weight-decay", "0.1"}), Catch::Contains("--weight-decay: sgd here does not read it"));
  CHECK(parse_options({"--model", "vit", "--weight-decay", "0.1"}).weight_decay == 0.1);
  CHECK(parse_options({"--optimizer", "sgd", "--model", "vit", "--momentum", "0.5"}).momentum == 0.5);
  CHECK_THROWS_WITH(parse_options({"--lr-warmup", "-1"}), Catch::Contains("must be >= 0"));
  CHECK_THROWS_WITH(parse_options({"--schedule", "zb"}), Catch::Contains("not one of: gpipe, 1f1b"));
  CHECK(parse_options({"--parallel", "dp", "--devices", "3"}).devices == 3);
  CHECK_THROWS_WITH(parse_options({"--momentum", "1.5"}), Catch::Contains("[0, 1)"));
  CHECK_THROWS_WITH(parse_options({"--frobnicate"}), Catch::Contains("unknown option '--frobnicate'"));
  CHECK_THROWS_AS(parse_options({"--nproc", "-2"}), usage_error);
}

TEST_CASE("example options: --precision and --reduce-16bit", "[examples][options][precision]") {
  CHECK(parse_options({"--precision", "fp16"}).precision == "fp16");
  const auto o = parse_options({"--precision", "bf16", "--reduce-16bit"});
  CHECK(o.precision == "bf16");
  CHECK(o.reduce_16bit);
  CHECK_THROWS_WITH(parse_options({"--precision", "fp8"}), Catch::Contains("'fp8' is not one of: fp32, bf16, fp16"));
  CHECK_THROWS_WITH(parse_options({"--precision", "fp16", "--parallel", "dp"}),
                    Catch::Contains("mixed precision runs with --parallel ddp"));
  CHECK_THROWS_WITH(parse_options({"--reduce-16bit"}), Catch::Contains("--reduce-16bit needs --precision fp16 or bf16"));
  CHECK(parse_options({"--precision", "bf16", "--parallel", "fsdp"}).parallel == "fsdp");  // 16-bit gathers and reductions
  CHECK_THROWS_WITH(parse_options({"--precision", "bf16", "--parallel", "fsdp", "--reduce-16bit"}),
                    Catch::Contains("fsdp with --precision already reduces in 16 bits"));
}

TEST_CASE("example options: non-finite numbers and overflowing sizes are refused", "[examples][options]") {
  CHECK_THROWS_WITH(parse_options({"--lr", "inf"}), Catch::Contains("--lr: 'inf' is not a finite number"));
  CHECK_THROWS_WITH(parse_options({"--lr", "nan"}), Catch::Contains("--lr: 'nan' is not a finite number"));
  CHECK_THROWS_WITH(parse_options({"--momentum", "nan"}), Catch::Contains("not a finite number"));
  CHECK_THROWS_WITH(parse_options({"--bucket-kb", "18014398509481985"}), Catch::Contains("--bucket-kb: at most"));
  CHECK(parse_options({"--bucket-kb", "1073741824"}).bucket_kb == (std::size_t{1} << 30));
}

TEST_CASE("example options: --init-from and --export, host modes other than pipeline", "[examples][options]") {
  const auto o = parse_options({"--init-from", "a.safetensors", "--export", "b.safetensors", "--parallel", "fsdp"});
  CHECK(o.init_from == "a.safetensors");
  CHECK(o.export_to == "b.safetensors");
  CHECK(parse_options({"--parallel", "zero2", "--export", "b"}).export_to == "b");
  CHECK(parse_options({"--sync", "diloco", "--init-from", "a"}).init_from == "a");
  CHECK_THROWS_WITH(parse_options({"--parallel", "pipeline", "--init-from", "a"}),
                    Catch::Contains("--init-from: not with --parallel pipeline"));
  CHECK_THROWS_WITH(parse_options({"--device", "cuda", "--backend", "nccl", "--export", "b"}),
                    Catch::Contains("--export: with the host model only (--device cpu)"));
  CHECK_THROWS_WITH(parse_options({"--export"}), Catch::Contains("--export: needs a value"));
}
