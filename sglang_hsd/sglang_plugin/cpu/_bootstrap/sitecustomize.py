"""Installs sglang-hsd's CPU shims at interpreter start-up (opt-in).

SGLang imports ``torchvision`` (and reaches ``sgl_kernel``) while its modules load, before any
``sglang.srt.plugins`` entry point runs, and in every process it spawns. Putting this directory on
``PYTHONPATH`` makes Python run this file first in each of those processes::

    PYTHONPATH=$(python -c 'import sglang_hsd.sglang_plugin as m; print(m.BOOTSTRAP_DIR)') \
        python -m sglang.launch_server --device cpu ...

Nothing happens when the real packages import, or when SGLANG_HSD_CPU_SHIMS=0.
"""

import os

if os.environ.get("SGLANG_HSD_CPU_SHIMS", "1") != "0":
    try:
        from sglang_hsd.sglang_plugin.cpu.cpu_shims import install_cpu_shims

        install_cpu_shims()
    except Exception as exc:  # start-up must not die here; SGLang's own error is clearer
        import sys

        print(f"sglang-hsd: CPU shims not installed: {exc!r}", file=sys.stderr)
