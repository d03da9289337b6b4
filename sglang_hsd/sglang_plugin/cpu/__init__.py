"""CPU-only scaffolding for running SGLang 0.5.23 with the HSD plugin on a machine without GPUs.

* ``kernel_ops``: plain-torch stand-ins for the ``sgl_kernel`` CPU ops SGLang's speculative path
  calls;
* ``cpu_shims``: installs them as ``sgl_kernel``, plus an import-only ``torchvision``, before
  SGLang is imported (``_bootstrap/sitecustomize.py``, put on ``PYTHONPATH`` as
  ``sglang_hsd.sglang_plugin.BOOTSTRAP_DIR``);
* ``cpu_sampling``: torch versions of the sampling kernels SGLang lacks on CPU (top-k / top-p
  renormalisation, the draft sampler's row argmax), installed by ``register()``;
* ``cpu_server``: the launch command, environment and lifetime of a CPU server (tests, benchmarks,
  ``sglang-hsd serve``);
* ``memory``: what a CPU server's models need in host memory, and its ``--mem-fraction-static``;
* ``tiny_models``: tiny random Llama targets with a self-made tokenizer for those servers.

Nothing here imports SGLang at module level.
"""
