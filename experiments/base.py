"""Every default of a depthbench experiment, in one place.

Other specs start from this one (``from experiments import base`` is not
needed: ``depthbench.config.load_spec`` exposes ``base_config()``) and change
only what differs.  Every field can be overridden on the command line with
``--config.section.field=value``.  The defaults describe the CPU-sized
``micro`` setting: a pre_ln model of the micro suite trained on the bundled
micro corpus.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "base"

    # ------------------------------------------------------------------ model
    m = c.model = ml_collections.ConfigDict()
    m.family = "pre_ln"  # see `depthbench families`
    # Shape.  Resolution order (depthbench.shapes.resolve_shape):
    #   d_model > 0          -> explicit shape (d_ff = 0 means the rule's d_ff)
    #   suite != ""          -> the suite's table row with this depth
    #   otherwise            -> the shape rule for (budget, vocab, depth, fix)
    m.depth = 4
    m.suite = "micro"
    m.budget = 0.0  # parameters; used only when suite == "" and d_model == 0
    m.fix = "total"  # "total" | "backbone": which count the budget holds
    m.d_model = 0
    m.d_ff = 0
    m.n_heads = 0  # 0: the suite's / rule's number of heads
    m.n_kv_heads = 0  # 0: same as n_heads (no GQA)
    m.vocab_size = 2048  # the tokenizer is trained to this size
    # Backbone numerics.
    m.norm_eps = 1e-6
    m.rope_theta = 10000.0
    m.init_std = 0.02
    m.param_dtype = "float32"
    m.compute_dtype = "float32"  # "bfloat16" at paper scale
    m.attention_impl = "xla"  # passed to jax.nn.dot_product_attention
    # Layer stack.
    m.scan_unroll = 1  # 1: rolled nn.scan; depth: fully unrolled (same params)
    # "none" | "nothing_saveable" | "dots_saveable" | "everything_saveable"
    m.remat_policy = "nothing_saveable"
    m.impl = "xla"  # residual-routing implementation ("pallas" once pallas_kernels/ lands)
    # Residual-family fields (spec/residuals.md); each family reads its own.
    r = m.residual = ml_collections.ConfigDict()
    r.hc_n = 4  # hc/mhc expansion (number of streams)
    r.hc_tanh = True  # hc: tanh on the dynamic parts
    r.hc_scale_init = 0.01  # hc: s_a, s_b; mhc: a_pre, a_post, a_res
    r.readout = "norm_then_sum"  # hc/mhc: "norm_then_sum" | "sum_then_norm"
    r.sinkhorn_iters = 20
    r.sinkhorn_temperature = 1.0
    r.mhc_bias = 8.0  # mhc: |b_pre| and -B_res off-diagonal at init
    r.attnres_blocks = 8  # attnres_block: number of blocks over the 2L sublayers
    r.attnres_block_size = 0  # attnres_block: sublayers per block; 0 = from attnres_blocks
    r.deepnorm_alpha = 0.0  # 0: (2L)^(1/4)
    r.deepnorm_beta = 0.0  # 0: (8L)^(-1/4)
    r.keel_alpha = 0.0  # 0: 2L
    r.lns_power = 0.5  # lns: divide by l ** lns_power (l = 1-based block index)
    r.mix_ln_fraction = 0.25  # mix_ln: first round(fraction * L) blocks are post_ln
    r.completep_alpha = 0.5  # completep: branch multiplier (L / L_base) ** -alpha
    r.completep_base_depth = 4

    # ------------------------------------------------------------------- data
    d = c.data = ml_collections.ConfigDict()
    d.corpus = "micro"  # "micro" | "text" | "jsonl" | "tokens"
    d.paths = ""  # comma-separated files or globs for text / jsonl / tokens
    d.text_field = "text"  # jsonl: field holding the document
    d.split_by = "file"  # text: "file" (one document per file) | "paragraph"
    d.tokens_dtype = "uint16"  # tokens: "uint16" | "uint32"
    d.eos_id = -1  # tokens: the EOS id separating documents (-1: tokenizer's)
    d.val_fraction = 0.02  # held-out documents (by hash)
    d.tokenizer = ""  # path of a SentencePiece .model; "" = train one
    d.tokenizer_sample_bytes = 20_000_000  # bytes of text used to train it
    d.cache_dir = ""  # "" = $DEPTHBENCH_CACHE or ~/.cache/depthbench
    d.shuffle_seed = 0
    d.prefetch = 2  # batches prepared ahead of the step
    d.worker_count = 0  # grain worker processes (0: in-process)
    d.val_windows = 64  # validation windows evaluated at each eval step

    # ------------------------------------------------------------------ train
    t = c.train = ml_collections.ConfigDict()
    t.steps = 300
    t.batch_size = 16  # global batch, in sequences
    t.microbatches = 1  # gradient accumulation: batch_size / microbatches per pass
    t.seq_len = 128
    t.lr = 3e-3
    t.lr_rule = "none"  # "none" | "completep": depth-transfer learning-rate rule
    t.warmup_fraction = 0.1
    t.final_lr_fraction = 0.1
    t.b1 = 0.9
    t.b2 = 0.95
    t.eps = 1e-8
    t.weight_decay = 0.1
    t.no_decay = ""  # comma-separated param leaf names exempt from decay, beyond the family's
    t.clip_norm = 1.0
    t.seed = 0
    t.log_every = 10
    t.eval_every = 100
    t.checkpoint_every = 100
    t.keep_checkpoints = 2
    t.max_loss = 20.0  # a loss above this counts as divergence
    t.layer_stats_every = 100  # per-block residual RMS / update norms to TensorBoard

    # --------------------------------------------------------------- parallel
    p = c.parallel = ml_collections.ConfigDict()
    p.data = -1  # mesh axis sizes; -1 = all remaining devices
    p.fsdp = 1
    p.tensor = 1
    p.distributed = "auto"  # "auto" | "on" | "off": jax.distributed.initialize()

    # --------------------------------------------------------------- analysis
    # `depthbench sweep` analyses each run it finishes (docs/spec/analysis.md)
    # when enabled; a runtime field: switching it does not change the run.
    a = c.analysis = ml_collections.ConfigDict()
    a.enabled = False
    a.metrics = ""  # comma-separated subset; "" = all
    a.windows = 16  # held-out windows of the validation split
    a.seq_len = 128
    return c
