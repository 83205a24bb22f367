"""Published training runs on Hopper GPUs (H100 SXM 80 GB; torchtitan's on Meta's 96 GB HBM2e H100 at 500 W,
the `grand-teton-h100` preset, and Trainy's on H200, the `h200` preset), for benchmarks/published_runs.py.

Each row states the runtime it describes, because the same layout runs at different speeds under different
stacks, and dstk prices a runtime by its flags:
- Megatron-Core / NeMo / DGX Cloud recipes (Transformer Engine): `--fused-kernels --flash-attention`, cuDNN
  fused attention at `--attention-efficiency 0.55` (the FlashAttention-3 repository's H100 charts: cuDNN
  forward ~600, backward ~500 TFLOP/s at head dim 128), the distributed optimizer as ZeRO-1, Megatron's
  sequence parallelism and vocabulary-parallel embedding with TP, `--comm-overlap` (their H100 recipes run
  --overlap-grad-reduce, --overlap-param-gather and TE's --tp-comm-overlap), `--virtual-stages` where the
  recipe interleaves; context parallelism (CP) is priced as DeepSpeed-Ulysses `--sp` of the same degree, the
  closest layout dstk prices (same attention split, different exchange).
- PyTorch FSDP stacks (MosaicML llm-foundry, torchtitan, IBM fms-fsdp): FULL_SHARD as ZeRO-3, SHARD_GRAD_OP as
  ZeRO-2, priced as FSDP runs them (`--fsdp`: one gather and one reduce-scatter per block, gradients reduced in
  fp32 under composer's `DEFAULT` mixed precision and torchtitan's default, in bf16 under fms-fsdp's
  `bfSixteen`), with FlashAttention-2 (the preset's attention efficiency, torch's SDPA), eager kernels.
Sources (row by row in `source`): NVIDIA DGX Cloud benchmarking recipes (NVIDIA/dgxc-benchmarking@143b90dd
READMEs: aggregate tokens/s and step times), Megatron-LM's README weak-scaling table (Megatron-Core r0.8.0,
per-GPU TFLOP/s), the Nemotron-4 15B paper (Parmar et al. 2024, Table 2: iteration times), the Llama 3 paper
(Dubey et al. 2024, Table 4), NeMo's long-sequence performance table (NVIDIA/NeMo@19fadb67
docs/source/performance/performance_long_sequence.md: model TFLOP/s per GPU), MosaicML llm-foundry's
scripts/train/benchmarking/README.md (H100 bf16 tables), torchtitan's benchmarks/llama3_h100_202412_torchtitan.md
and benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md,
IBM foundation-model-stack/fms-fsdp README. The figures are quoted as printed; tokens/s per GPU are derived from
aggregate figures by dividing by the GPUs.
"""

from __future__ import annotations

MODEL_DIR = "{models}"
# shapes the rows need beyond dstk's presets (from the sources' configs and papers)
HOPPER_MODELS: dict[str, dict] = {
    **{
        # MPTConfig's defaults as llm-foundry's pretrain yamls leave them: learned positions (`alibi` off),
        # biases, no dropout (resid/emb/attn_pdrop 0.0), exact GeLU; NumParams in the table match this shape
        # (1b: 1,315,950,592)
        f"mpt-{name}": dict(
            architecture="gpt2",
            n_layers=layers,
            hidden_size=h,
            n_heads=heads,
            vocab_size=50368,
            seq_length=2048,
            position_embedding="learned",
            activation="gelu",
            dropout=False,
            max_position_embeddings=2048,
        )
        for name, layers, h, heads in (
            ("1b", 24, 2048, 16),
            ("3b", 32, 2560, 32),
            ("7b", 32, 4096, 32),
            ("13b", 40, 5120, 40),
            ("70b", 80, 8192, 64),
        )
    },
    **{
        f"mlm-{name}": dict(
            architecture="gpt2",
            n_layers=layers,
            hidden_size=h,
            n_heads=heads,
            vocab_size=131072,
            seq_length=4096,
            max_position_embeddings=4096,
            activation="gelu",
        )
        for name, layers, h, heads in (
            ("7.1b", 30, 4096, 32),
            ("16b", 32, 6144, 48),
            ("32b", 48, 7168, 56),
            ("70b", 84, 8192, 64),
            ("119b", 92, 10240, 80),
            ("177b", 96, 12288, 96),
            ("314b", 96, 16384, 128),
        )
    },
    "gpt3-175b-2k": dict(
        architecture="gpt2",
        n_layers=96,
        hidden_size=12288,
        n_heads=96,
        vocab_size=50257,
        seq_length=2048,
        max_position_embeddings=2048,
        activation="gelu",
    ),
    # Nemotron-4: squared-ReLU MLP of 4h, GQA (Parmar et al. 2024, Table 1), priced with a plain ReLU MLP
    "nemotron4-15b": dict(
        architecture="llama",
        n_layers=32,
        hidden_size=6144,
        n_heads=48,
        n_kv_heads=8,
        ffn_hidden_size=24576,
        gated_mlp=False,
        activation="relu",
        vocab_size=256000,
        seq_length=4096,
    ),
    "nemotron4-340b": dict(
        architecture="llama",
        n_layers=96,
        hidden_size=18432,
        n_heads=96,
        n_kv_heads=8,
        ffn_hidden_size=73728,
        gated_mlp=False,
        activation="relu",
        vocab_size=256000,
        seq_length=4096,
    ),
    "llama3-70b": dict(
        architecture="llama",
        n_layers=80,
        hidden_size=8192,
        n_heads=64,
        n_kv_heads=8,
        ffn_hidden_size=28672,
        vocab_size=128256,
        seq_length=8192,
    ),
    "llama2-13b": dict(
        architecture="llama",
        n_layers=40,
        hidden_size=5120,
        n_heads=40,
        ffn_hidden_size=13824,
        vocab_size=32000,
        seq_length=4096,
    ),
    "llama2-70b": dict(
        architecture="llama",
        n_layers=80,
        hidden_size=8192,
        n_heads=64,
        n_kv_heads=8,
        ffn_hidden_size=28672,
        vocab_size=32000,
        seq_length=4096,
    ),
}

MCORE = "--fused-kernels --flash-attention --zero-stage 1 --comm-overlap --attention-efficiency 0.55"
TPX = "--tp-sequence-parallel --tp-vocab-parallel"
DGXC = "NVIDIA/dgxc-benchmarking@143b90dd"
MOS = "mosaicml/llm-foundry scripts/train/benchmarking/README.md (H100 80GB BF16 tables)"
M = MODEL_DIR


def _mcore(model: str, nodes: int, layout: str) -> str:
    return f"--model {model} --cluster dgx-h100 --nodes {nodes} {layout} --recompute selective {MCORE}"


# (label, source, dstk estimate args, metric, published value, group)
HOPPER_RUNS: list[tuple[str, str, str, str, float, str]] = [
    *(
        (
            f"Megatron-Core GPT {name}, TP{tp} PP{pp}, {n} H100",
            "Megatron-LM README, weak-scaling table (Megatron-Core r0.8.0; per-GPU teraFLOP/s)",
            _mcore(f"{M}/mlm-{name}.yaml", n // 8, f"--tp {tp} --pp {pp} --global-batch {gb} {TPX}"),
            "model",
            tf,
            "Hopper, Megatron-Core/NeMo, bf16",
        )
        for name, tp, pp, n, gb, tf in (
            ("7.1b", 2, 1, 96, 192, 465.9),
            ("16b", 4, 1, 192, 192, 489.1),
            ("32b", 8, 1, 384, 192, 459.6),
            ("70b", 8, 2, 768, 384, 419.7),
            ("119b", 8, 4, 1536, 768, 420.5),
            ("177b", 8, 6, 2304, 1152, 432.8),
            ("314b", 8, 8, 3072, 1536, 474.4),
        )
    ),
    *(
        (
            f"NeMo GPT-3 175B, TP4 PP8 VP12, {n} H100",
            f"{DGXC} nemo-megatron README_175b.md (step {step} s)",
            _mcore(
                f"{M}/gpt3-175b-2k.yaml",
                n // 8,
                f"--tp 4 --pp 8 --virtual-stages 12 --micro-batch 1 --global-batch {gb} {TPX}",
            ),
            "tok",
            gb * 2048 / step / n,
            "Hopper, Megatron-Core/NeMo, bf16",
        )
        for n, gb, step in ((512, 1024, 9.09), (2048, 4096, 9.02))
    ),
    (
        "NeMo Nemotron-4 15B, TP4, 512 H100",
        f"{DGXC} README (step 2.92 s)",
        _mcore(f"{M}/nemotron4-15b.yaml", 64, f"--tp 4 --micro-batch 4 --global-batch 2048 {TPX}"),
        "tok",
        2048 * 4096 / 2.92 / 512,
        "Hopper, Megatron-Core/NeMo, bf16",
    ),
    (
        "NeMo Nemotron-4 340B, TP8 PP8 VP12, 512 H100",
        f"{DGXC} README (step 4.7 s)",
        _mcore(
            f"{M}/nemotron4-340b.yaml",
            64,
            f"--tp 8 --pp 8 --virtual-stages 12 --micro-batch 1 --global-batch 128 {TPX}",
        ),
        "tok",
        128 * 4096 / 4.7 / 512,
        "Hopper, Megatron-Core/NeMo, bf16",
    ),
    *(
        (
            f"Megatron Nemotron-4 15B, TP8, {n} H100",
            f"Parmar et al. 2024, Table 2 (iteration {it} s)",
            _mcore(f"{M}/nemotron4-15b.yaml", n // 8, f"--tp 8 --global-batch {gb} {TPX}"),
            "tok",
            gb * 4096 / it / n,
            "Hopper, Megatron-Core/NeMo, bf16",
        )
        for n, gb, it in ((768, 384, 0.57), (2304, 1152, 0.64))
    ),
    *(
        (
            f"NeMo Llama 3.1 70B, TP4 PP4 VP5 CP2, {n} H100",
            f"{DGXC} llama3.1 README_70b.md ({what})",
            _mcore(
                f"{M}/llama3-70b.yaml",
                n // 8,
                f"--tp 4 --pp 4 --virtual-stages 5 --sp 2 --micro-batch 1 --global-batch {gb} {TPX}",
            ),
            "tok",
            tps,
            "Hopper, Megatron-Core/NeMo, bf16",
        )
        for n, gb, tps, what in (
            (64, 128, 71235 / 64, "71,235 tokens/s"),
            (512, 1024, 1024 * 8192 / 14.89 / 512, "step 14.89 s"),
        )
    ),
    *(
        (
            f"NeMo Llama 3.1 8B, CP2, {n} H100",
            f"{DGXC} llama3.1 README_8b.md ({tps_all:,} tokens/s)",
            _mcore("llama3-8b", n // 8, f"--sp 2 --micro-batch 1 --global-batch {gb}"),
            "tok",
            tps_all / n,
            "Hopper, Megatron-Core/NeMo, bf16",
        )
        for n, gb, tps_all in ((8, 128, 81222), (128, 2048, 1280704))
    ),
    (
        "NeMo Llama 3.1 405B, TP8 PP9 VP7 CP2, 576 H100",
        f"{DGXC} llama3.1 README_405b.md (120,022 tokens/s)",
        _mcore(
            "llama3-405b",
            72,
            f"--tp 8 --pp 9 --virtual-stages 7 --sp 2 --micro-batch 1 --global-batch 252 {TPX}",
        ),
        "tok",
        120022 / 576,
        "Hopper, Megatron-Core/NeMo, bf16",
    ),
    (
        "Llama 3 405B, TP8 PP16, 8192 H100",
        "Dubey et al. 2024, Table 4 (430 TFLOP/s)",
        "--model llama3-405b --cluster dgx-h100 --nodes 1024 --tp 8 --pp 16 --zero-stage 1 --global-batch 2048 "
        f"--recompute none --fused-kernels --flash-attention --comm-overlap --attention-efficiency 0.55 {TPX}",
        "model",
        430,
        "Hopper, Megatron-Core/NeMo, bf16",
    ),
    # Table 4's long-context row: CP16 × TP8 = 128 GPUs (16 nodes) per attention group, CP priced as Ulysses
    # `--sp 16` (16 heads per TP rank divide by 16); 128 sequences of 131,072 tokens (batch 16 per DP rank, DP8)
    (
        "Llama 3 405B, TP8 CP16 PP16, 131K tokens, 16384 H100",
        "Dubey et al. 2024, Table 4 (380 TFLOP/s; seq 131,072, batch/DP 16, DP8)",
        "--model llama3-405b --cluster dgx-h100 --nodes 2048 --tp 8 --pp 16 --sp 16 --zero-stage 1 "
        "--micro-batch 1 --global-batch 128 --seq-length 131072 --recompute none --fused-kernels "
        f"--flash-attention --comm-overlap --attention-efficiency 0.55 {TPX}",
        "model",
        380,
        "Hopper, Megatron-Core/NeMo, bf16",
    ),
    # The same DGX Cloud recipes in FP8 (Transformer Engine, delayed scaling; same layouts, same READMEs'
    # "Expected Performance" FP8 tables): `--precision fp8` prices TE's casts, amax reductions and weight copies
    *(
        (
            f"NeMo {name} FP8, {n} H100",
            f"{DGXC} {readme} FP8 ({what})",
            _mcore(model, n // 8, f"{layout} --precision fp8"),
            "tok",
            tps,
            "Hopper, Megatron-Core/NeMo, fp8",
        )
        for name, n, model, readme, layout, tps, what in (
            (
                "GPT-3 175B, TP4 PP8 VP12",
                512,
                f"{M}/gpt3-175b-2k.yaml",
                "nemo-megatron README_175b.md",
                f"--tp 4 --pp 8 --virtual-stages 12 --micro-batch 1 --global-batch 1024 {TPX}",
                1024 * 2048 / 6.44 / 512,
                "step 6.44 s",
            ),
            (
                "Nemotron-4 15B, TP4",
                512,
                f"{M}/nemotron4-15b.yaml",
                "README_15b.md",
                f"--tp 4 --micro-batch 4 --global-batch 2048 {TPX}",
                2048 * 4096 / 2.12 / 512,
                "step 2.12 s",
            ),
            (
                "Nemotron-4 340B, TP8 PP8 VP12",
                512,
                f"{M}/nemotron4-340b.yaml",
                "README_340b.md",
                f"--tp 8 --pp 8 --virtual-stages 12 --micro-batch 1 --global-batch 128 {TPX}",
                128 * 4096 / 3.26 / 512,
                "step 3.26 s",
            ),
            (
                "Llama 3.1 70B, TP4 PP4 VP5 CP2",
                64,
                f"{M}/llama3-70b.yaml",
                "llama3.1 README_70b.md",
                f"--tp 4 --pp 4 --virtual-stages 5 --sp 2 --micro-batch 1 --global-batch 128 {TPX}",
                95239 / 64,
                "95,239 tokens/s",
            ),
            (
                "Llama 3.1 8B, CP2",
                8,
                "llama3-8b",
                "llama3.1 README_8b.md",
                "--sp 2 --micro-batch 1 --global-batch 128",
                108436 / 8,
                "108,436 tokens/s",
            ),
            (
                "Llama 3.1 405B, TP8 PP9 VP7 CP2",
                576,
                "llama3-405b",
                "llama3.1 README_405b.md",
                f"--tp 8 --pp 9 --virtual-stages 7 --sp 2 --micro-batch 1 --global-batch 252 {TPX}",
                183664 / 576,
                "183,664 tokens/s",
            ),
        )
    ),
    # NeMo's long-sequence table, Llama 2 7B (MHA, 32 heads) in FP8 on DGX-H100 (NeMo 24.03.01), the two rows whose
    # TP × CP group spans nodes and that Ulysses can price (heads per TP rank divisible by CP): TP4 CP4 (16 GPUs)
    # at 128K, TP4 CP8 (32 GPUs) at 256K; PP1, micro-batch 1 (not printed). Its TFLOP/s are NeMo's model FLOPs,
    # 6N + 12·L·h·s (non-causal), dstk's convention: the NeMo 24.07 performance summary's LLAMA2-7B, 780 TFLOP/s
    # at 16,934 tokens/s/GPU, is 46.06 GFLOP/token; dstk counts 46.09 at 4K [derived]. (512K and 1024K run TP8
    # CP16/CP32: 4 heads per TP rank, which Ulysses cannot split 16 ways; not priced.)
    *(
        (
            f"NeMo Llama 2 7B FP8, {k}K tokens, TP4 CP{cp}, {n} H100",
            f"NVIDIA/NeMo@19fadb67 docs/source/performance/performance_long_sequence.md (LLAMA2-7B (FP8) - H100, "
            f"NeMo 24.03.01: {tf} TFLOPS/GPU, batch {gb}, DP8)",
            _mcore(
                "llama-7b",
                n // 8,
                f"--tp 4 --sp {cp} --micro-batch 1 --global-batch {gb} --seq-length {k * 1024} {TPX} --precision fp8",
            ),
            "model",
            tf,
            "Hopper, Megatron-Core/NeMo, fp8",
        )
        for k, n, gb, cp, tf in ((128, 128, 32, 4, 555), (256, 256, 16, 8, 549))
    ),
    # PyTorch FSDP stacks. llm-foundry's two H100 bf16 tables come from two sweeps: the large-scale one (128-512
    # GPUs; scripts/train/benchmarking/sweep.py @5e85bd62d, Jan 2024) passes --fsdp_config_backward_prefetch
    # BACKWARD_PRE, forward prefetch and FlashAttention-2 (`--attn_impl flash`; 13b and 30b: `triton`); the
    # other (8-64 GPUs; sweep.sh @b2a43a147, Oct 2023) passes no prefetch flag, so composer's FSDPConfig
    # default BACKWARD_POST applies, and submit_benchmarks.py's default `--attn_impl triton` (MPT's Triton
    # flash attention; priced as FlashAttention-2, no Hopper figure published for it)
    *(
        (
            f"MosaicML MPT-{name}, FSDP {mode}, {n} H100, b={b}" + (f"×{ga}" if ga > 1 else ""),
            f"{MOS} ({tps} T/s/GPU{'; BACKWARD_POST, triton attention' if post else ''})",
            f"--model {M}/mpt-{name}.yaml --cluster dgx-h100 --nodes {n // 8} --zero-stage {3 if mode == 'FULL' else 2} "
            f"--micro-batch {b} --global-batch {b * ga * n} --recompute {rc} --flash-attention --fsdp fp32"
            + (" --fsdp-backward-prefetch post" if post else ""),
            "tok",
            tps,
            "Hopper, PyTorch FSDP, bf16",
        )
        for name, mode, n, b, ga, rc, post, tps in (
            ("1b", "GRAD_OP", 512, 12, 1, "none", False, 39837),
            ("1b", "GRAD_OP", 128, 12, 1, "none", False, 44123),
            ("3b", "GRAD_OP", 512, 8, 1, "none", False, 21664),
            ("7b", "FULL", 512, 6, 1, "none", False, 9670),
            ("7b", "FULL", 256, 6, 1, "none", False, 10119),
            ("7b", "FULL", 8, 6, 1, "none", True, 10643),
            ("13b", "FULL", 512, 16, 1, "full", False, 4952),
            ("70b", "FULL", 512, 8, 1, "full", False, 1007),
            ("70b", "FULL", 64, 8, 4, "full", True, 1039),
        )
    ),
    *(
        (
            f"torchtitan Llama 3.1 8B, FSDP2, {n} H100",
            f"torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Table {t}, FSDP without torch.compile: "
            f"{tps:,} TPS/GPU; H100 96 GB HBM2e at 500 W)",
            f"--model llama3-8b --cluster grand-teton-h100 --nodes {n // 8} --zero-stage 3 --micro-batch 2 --global-batch "
            f"{2 * n} --recompute ops --flash-attention --fsdp fp32",
            "tok",
            tps,
            "Hopper, PyTorch FSDP, bf16",
        )
        for n, t, tps in ((8, 1, 5762), (128, 3, 5605))
    ),
    # The rest of the same torchtitan report (torchtitan @9dec370, torch 1963fc8, torchao eab345c; seq 8192): the
    # torch.compile rows (priced with --fused-kernels: compile fuses the norms, rotary and SwiGLU) and the Float8
    # rows (torchao's tensorwise float8 on every nn.Linear but the output layer, `filter_fqns = ["output"]`,
    # dstk's fp8: FP8 linear GEMMs, LM head and attention in bf16; FSDP gathers priced in bf16, the report not
    # saying whether `enable_fsdp_float8_all_gather` was on). Table 2's context parallelism (ring attention) is
    # priced as Ulysses `--sp` of the same degree, as the NeMo CP rows are; Table 4's AsyncTP as --comm-overlap
    # (TP collectives behind the GEMMs). The 8B's "selective" AC is torchtitan's op-level policy (every second
    # matmul and the elementwise ops recomputed; `--recompute ops`: 9dec370's `_save_list`, the H200 run's e7c0cae
    # the same less aten.abs). Tables 5-6 (405B, FSDP + TP + PP) are not priced: dstk's pipelines run ZeRO <= 1.
    *(
        (
            f"torchtitan Llama 3.1 8B, FSDP2 + compile{' + Float8' if fp8 else ''}, {n} H100",
            f"torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Table {t}: {tps:,} TPS/GPU; H100 96 GB HBM2e "
            f"at 500 W)",
            f"--model llama3-8b --cluster grand-teton-h100 --nodes {n // 8} --zero-stage 3 --micro-batch 2 --global-batch "
            f"{2 * n} --recompute ops --flash-attention --fsdp fp32 --fused-kernels"
            + (" --precision fp8" if fp8 else ""),
            "tok",
            tps,
            f"Hopper, PyTorch FSDP, {'fp8' if fp8 else 'bf16'}",
        )
        for n, t, fp8, tps in (
            (8, 1, False, 6667),
            (8, 1, True, 8532),
            (128, 3, False, 6514),
            (128, 3, True, 8380),
        )
    ),
    *(
        (
            f"torchtitan Llama 3.1 8B, FSDP{8 // cp} CP{cp} + compile + Float8, {k}K tokens, 8 H100",
            f"torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Table 2: {tps:,} TPS/GPU; full AC, local batch 1)",
            f"--model llama3-8b --cluster grand-teton-h100 --nodes 1 --zero-stage 3 --sp {cp} --micro-batch 1 "
            f"--global-batch {8 // cp} --seq-length {k * 1024} --recompute full --flash-attention --fsdp fp32 "
            f"--fused-kernels --precision fp8",
            "tok",
            tps,
            "Hopper, PyTorch FSDP, fp8",
        )
        for cp, k, tps in ((1, 32, 3890), (2, 64, 2540), (4, 128, 1071), (8, 256, 548))
    ),
    *(
        (
            f"torchtitan Llama 3.1 70B, FSDP32 TP8{' AsyncTP' if overlap else ''} + compile + Float8, 256 H100",
            f"torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Table 4: {tps} TPS/GPU; full AC, local batch 16)",
            f"--model {M}/llama3-70b.yaml --cluster grand-teton-h100 --nodes 32 --tp 8 --zero-stage 3 --micro-batch 16 "
            f"--global-batch 512 --recompute full --flash-attention --fsdp fp32 --fused-kernels --precision fp8 "
            f"--tp-sequence-parallel" + (" --comm-overlap" if overlap else ""),
            "tok",
            tps,
            "Hopper, PyTorch FSDP, fp8",
        )
        for overlap, tps in ((False, 829), (True, 876))
    ),
    # An independent torchtitan run on H200 (Trainy on WhiteFiber, June 2025; torchtitan e7c0cae, torchao 0afa4c1):
    # Llama 3.1 8B, local batch 2, seq 8192, op-level selective AC, torch.compile, Float8 with FP8 FSDP gathers
    # and precomputed scales (gathers priced in bf16 here), 400 Gb/s per GPU: the `h200` preset
    *(
        (
            f"torchtitan Llama 3.1 8B, FSDP2 + compile + Float8, {n} H200",
            f"torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md ({tps:,} TPS/GPU)",
            f"--model llama3-8b --cluster h200 --nodes {n // 8} --zero-stage 3 --micro-batch 2 --global-batch {2 * n} "
            f"--recompute ops --flash-attention --fsdp fp32 --fused-kernels --precision fp8",
            "tok",
            tps,
            "Hopper, PyTorch FSDP, fp8",
        )
        for n, tps in ((32, 10938), (64, 10753))
    ),
    # fms-fsdp@267bd4bb's "Selective AC" is `selective_checkpointing` k: every k-th LLaMABlock fully checkpointed
    # (fms_fsdp/policies/ac_handler.py), not Megatron's attention-core recomputation; the 13B run's k is not
    # published, but the README's MFU column, taken with PyTorch's FLOP counter (which counts recomputation: the
    # fully checkpointed 70B reads 0.45 where 6N + attention gives 0.36), reads 0.40 for 13B where 6N + attention
    # gives 0.34: ~0.54 of a forward recomputed, every 2nd block [derived]. The 70B's ratio, 1.25 (1.22-1.28
    # within the MFUs' rounding), is what its non-reentrant checkpoint's early stop executes: dstk's hardware
    # FLOPs over model FLOPs read 1.248 with the down projections left out, 1.332 replaying whole blocks. For
    # the 13B, every 2nd block with early stop reads 1.132, whole blocks 1.165, every block 1.265 (1.145-1.209
    # published): k = 2 stays the nearest integer
    *(
        (
            f"IBM fms-fsdp Llama 2 {name}, 96 H100",
            f"foundation-model-stack/fms-fsdp README @267bd4bb ({tps} tokens/s/GPU; {ac})",
            f"--model {ref} --cluster dgx-h100 --nodes 12 --zero-stage 3 --micro-batch 2 --global-batch 192 "
            f"--recompute {rc} --flash-attention --seq-length 4096 --fsdp bf16",
            "tok",
            tps,
            "Hopper, PyTorch FSDP, bf16",
        )
        for name, ref, rc, ac, tps in (
            ("7B", "llama-7b", "none", "HSDP, no AC", 7500),
            (
                "13B",
                f"{M}/llama2-13b.yaml",
                "full --recompute-every 2",
                "selective AC: every 2nd block",
                3800,
            ),
            ("70B", f"{M}/llama2-70b.yaml", "full", "full AC", 800),
        )
    ),
]

# Memory the torchtitan reports give beside their throughput: `max_reserved_gib` of torch.cuda.memory_stats (the
# peak the caching allocator reserved, which is at least what was live; train.py:393 @9dec370,
# components/metrics.py:403 @e7c0cae), GiB. The H200 run's torchtitan (e7c0cae) compiles the loss with the model
# (components/loss.py:27-29), which keeps no fp32 copy of the logits; dstk prices the eager loss the December 2024
# runs used (9dec370 train.py:131-138, the compile commented out), 12·s·b·V bytes.
PUBLISHED_MEMORY_GIB: dict[str, float] = {
    "torchtitan Llama 3.1 8B, FSDP2, 8 H100": 82.4,
    "torchtitan Llama 3.1 8B, FSDP2 + compile, 8 H100": 77.0,
    "torchtitan Llama 3.1 8B, FSDP2 + compile + Float8, 8 H100": 76.8,
    "torchtitan Llama 3.1 8B, FSDP2, 128 H100": 67.0,
    "torchtitan Llama 3.1 8B, FSDP2 + compile, 128 H100": 62.0,
    "torchtitan Llama 3.1 8B, FSDP2 + compile + Float8, 128 H100": 61.8,
    "torchtitan Llama 3.1 8B, FSDP8 CP1 + compile + Float8, 32K tokens, 8 H100": 83.9,
    "torchtitan Llama 3.1 8B, FSDP4 CP2 + compile + Float8, 64K tokens, 8 H100": 84.2,
    "torchtitan Llama 3.1 8B, FSDP2 CP4 + compile + Float8, 128K tokens, 8 H100": 84.0,
    "torchtitan Llama 3.1 8B, FSDP1 CP8 + compile + Float8, 256K tokens, 8 H100": 84.5,
    "torchtitan Llama 3.1 70B, FSDP32 TP8 + compile + Float8, 256 H100": 71.9,
    "torchtitan Llama 3.1 70B, FSDP32 TP8 AsyncTP + compile + Float8, 256 H100": 67.6,
    "torchtitan Llama 3.1 8B, FSDP2 + compile + Float8, 32 H200": 47.96,
    "torchtitan Llama 3.1 8B, FSDP2 + compile + Float8, 64 H200": 46.97,
}
