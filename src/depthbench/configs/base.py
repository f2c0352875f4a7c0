"""Every default of a depthbench experiment: the schema every spec is checked against.

The defaults describe the CPU-sized ``micro`` setting (a pre_ln model of the
micro suite on the bundled micro corpus); other specs start from this one
(docs/CONFIG.md) and override fields with ``--config.section.field=value``."""

import ml_collections

from depthbench.model.residual.protocol import registry


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "base"

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
    # "xla": layers.causal_attention; "cudnn": jax.nn.dot_product_attention
    m.attention_impl = "xla"
    # Layer stack.
    m.scan_unroll = 1  # 1: rolled nn.scan; depth: fully unrolled (same params)
    # "none" or a jax.checkpoint_policies name ("nothing_saveable", "dots_saveable" ...)
    m.remat_policy = "nothing_saveable"
    # "depth_linear": states with depth banks (attnres, moda) keep memory linear in
    # depth (model/depth_scan.py); "carries": nn.scan saves every block's carry.
    m.layer_scan = "depth_linear"
    m.impl = "xla"  # routing: "xla" | "pallas" (fused kernels) | "auto" (pallas on 1 TPU/GPU)
    # Only the chosen family's own fields, declared in its module (docs/CONFIG.md).
    m.residual = ml_collections.ConfigDict(registry.get(m.family).config_fields())

    d = c.data = ml_collections.ConfigDict()
    d.corpus = "micro"  # "micro" | "text" | "jsonl" | "tokens"
    d.paths = ""  # comma-separated files or globs for text / jsonl / tokens
    d.text_field = "text"  # jsonl: field holding the document
    d.split_by = "file"  # text: "file" (one document per file) | "paragraph"
    d.tokens_dtype = "uint16"  # tokens: "uint16" | "uint32"
    d.eos_id = -1  # tokens: the EOS id separating documents (-1: tokenizer's)
    d.val_fraction = 0.02  # held-out documents (by hash)
    d.tokenizer = ""  # a SentencePiece .model or a tokenizer.json; "" = train one
    d.tokenizer_sample_bytes = 20_000_000  # bytes of text used to train it
    d.cache_dir = ""  # "" = $DEPTHBENCH_CACHE or ~/.cache/depthbench
    d.shuffle_seed = 0
    d.prefetch = 2  # batches prepared ahead of the step
    d.worker_count = 0  # grain worker processes (0: in-process)
    d.val_windows = 64  # validation windows evaluated at each eval step

    t = c.train = ml_collections.ConfigDict()
    t.steps = 300
    t.batch_size = 16  # global batch, in sequences
    t.microbatches = 1  # gradient accumulation: batch_size / microbatches per pass
    t.seq_len = 128
    t.lr = 3e-3
    t.lr_rule = "none"  # "none" | "family": the family's depth-transfer LR rule (completep's)
    t.schedule = "cosine"  # after warmup: "cosine" | "linear" (decay to final_lr_fraction x lr)
    t.warmup_fraction = 0.1
    t.final_lr_fraction = 0.1
    t.b1 = 0.9
    t.b2 = 0.95
    t.eps = 1e-8
    t.weight_decay = 0.1
    # Parameters without weight decay: "recipe" (the original's: only what a family exempts,
    # hc/mhc static routing) | "norms_embeddings_residual" (no decay on norm gains, the input
    # embedding, every residual-family parameter); extra leaf names may follow: "recipe,scale".
    t.no_decay = "recipe"
    t.clip_norm = 1.0
    t.seed = 0
    t.log_every = 10
    t.eval_every = 100
    t.checkpoint_every = 100
    t.keep_checkpoints = 2
    t.max_loss = 20.0  # a loss above this counts as divergence
    t.layer_stats_every = 100  # per-block residual RMS / update norms to TensorBoard
    t.wandb = ""  # "" | "offline" | "online": W&B as a second sink (train/wandb_sink.py); runtime

    # Downstream evaluation after a sweep trains each run (docs/EVAL.md); runtime
    # fields: changing them never blocks resuming.
    e = c.eval = ml_collections.ConfigDict()
    e.suites = ""  # comma-separated: nll-code-stem-math, commonsense, bbh-reasoning
    e.data_dir = ""  # local records (DIR/<task>.jsonl or .parquet); "" = the hub
    e.limit = 0  # records per task (0: all)
    e.batch_size = 8

    # Supervised fine-tuning as the original DepthBench does it (docs/FINETUNE.md).
    # A fine-tuned run's config (`depthbench finetune`) names its parent run and
    # its data here.  In a pretraining spec the section is runtime: with records
    # set, `depthbench sweep` fine-tunes each finished run into RUN_DIR/sft/ with
    # the train recipe of finetune.spec and evaluates it as eval.suites says.
    f = c.finetune = ml_collections.ConfigDict()
    f.parent = ""  # the run fine-tuned (set by depthbench finetune; "" = pretraining)
    f.records = ""  # instruction records: local .json, .jsonl or .parquet
    f.data_digest = ""  # the prepared records' cache digest (set by depthbench finetune)
    f.spec = "sft"  # the fine-tuning recipe's spec: a bundled name or a file
    f.layout = "padded"  # "padded": one record per row | "packed": rows of whole records
    f.epochs = 3.0  # passes over the training records; sets train.steps
    f.max_seq_len = 512  # longest record in tokens (data sft --max-seq-len)
    f.max_samples = 0  # records kept after shuffling (0: all)
    f.val_fraction = 0.02  # records held out for the validation loss
    f.data_seed = 42  # the records' shuffle before the split (the original's)

    p = c.parallel = ml_collections.ConfigDict()
    p.data = -1  # mesh axis sizes; -1 = all remaining devices
    p.fsdp = 1
    p.tensor = 1
    p.distributed = "auto"  # "auto" | "on" | "off": jax.distributed.initialize()

    # `depthbench sweep` analyses each run it finishes (docs/spec/analysis.md)
    # when enabled; a runtime field: switching it does not change the run.
    a = c.analysis = ml_collections.ConfigDict()
    a.enabled = False
    a.metrics = ""  # comma-separated subset; "" = all
    a.windows = 16  # held-out windows of the validation split
    a.seq_len = 128
    return c
