"""What a researcher hands the runtime: a model factory, datasets, a loss step and eval metrics.

Two bundled tasks train on CPU in seconds with data that needs no download: a classifier on a seeded
Gaussian-mixture dataset, and a character-level transformer language model on the docstrings of the
Python standard library (shipped with every Python).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

if TYPE_CHECKING:
    from trainforge.trainer.runtime.config import RunConfig


@dataclass
class Task:
    """A training task.

    `loss(model, batch)` returns the mean loss of a micro-batch and how many samples/tokens it held.
    `eval_sums(model, batch)` returns additive tensors (summed over batches and ranks); `summarize` turns
    the totals into metrics, e.g. {"loss_sum", "correct", "count"} -> {"loss", "accuracy"}.
    The builders are optional (runtime/build.py has the defaults): `build_optimizer(model, cfg)`,
    `build_scheduler(optimizer, cfg)`, and `fsdp_units(model)`, the modules FSDP shards one by one (a
    transformer: its blocks; default: every parameterised leaf).
    """

    name: str
    build_model: Callable[[], nn.Module]
    train_set: Dataset
    eval_set: Dataset
    loss: Callable[[nn.Module, tuple], tuple[torch.Tensor, dict[str, int]]]
    eval_sums: Callable[[nn.Module, tuple], dict[str, torch.Tensor]]
    summarize: Callable[[dict[str, float]], dict[str, float]]
    metrics: tuple[str, ...]  # the names `summarize` returns
    default_metric: tuple[str, str]  # (name, "max" | "min") that picks the best checkpoint unless the run says otherwise
    build_optimizer: Callable[[nn.Module, RunConfig], torch.optim.Optimizer] | None = None
    build_scheduler: Callable[[torch.optim.Optimizer, RunConfig], torch.optim.lr_scheduler.LRScheduler] | None = None
    fsdp_units: Callable[[nn.Module], list[nn.Module]] | None = None
    # Under FSDP the model is built on the meta device and each module with tensors of its own is then initialised in
    # turn (runtime/build.py): by its reset_parameters() unless the task gives init_weights(name, module), which fills
    # that module's own parameters and buffers (its children are not yet materialised).
    init_weights: Callable[[str, nn.Module], None] | None = None
    # Training FLOPs per token (forward and backward) of the model: with tokens/s and the GPU's peak, the MFU gauge.
    flops_per_token: Callable[[nn.Module], float] | None = None


# ---- classifier -------------------------------------------------------------------------------------------

def gaussian_mixture(n: int, features: int = 32, classes: int = 8, seed: int = 1234) -> TensorDataset:
    """Seeded class-conditional Gaussians: the same tensors on every machine, no file needed.

    The class centres are fixed (one problem); `seed` only draws the samples (train and eval splits)."""
    centres = torch.randn(classes, features, generator=torch.Generator().manual_seed(7)) * 1.0
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    x = centres[labels] + torch.randn(n, features, generator=g) * 1.3
    return TensorDataset(x, labels)


def _classifier_loss(model: nn.Module, batch: tuple) -> tuple[torch.Tensor, dict[str, int]]:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y), {"samples": len(y)}


def _classifier_eval(model: nn.Module, batch: tuple) -> dict[str, torch.Tensor]:
    x, y = batch
    logits = model(x).float()
    return {"loss_sum": nn.functional.cross_entropy(logits, y, reduction="sum"),
            "correct": (logits.argmax(-1) == y).sum().float(), "count": torch.tensor(float(len(y)), device=y.device)}


def _classifier_summary(s: dict[str, float]) -> dict[str, float]:
    return {"loss": s["loss_sum"] / s["count"], "accuracy": s["correct"] / s["count"]}


def classifier(width: int = 256, depth: int = 2) -> Task:
    """An MLP; `width` and `depth` scale it (width 2048, depth 5 holds about 200 MB with its AdamW state)."""
    features, classes = 32, 8

    def build() -> nn.Module:
        layers: list[nn.Module] = [nn.Linear(features, width), nn.GELU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.GELU()]
        return nn.Sequential(*layers, nn.Linear(width, classes))

    return Task(
        name="classifier",
        build_model=build,
        train_set=gaussian_mixture(16384, features, classes, seed=1234),
        eval_set=gaussian_mixture(2048, features, classes, seed=4321),
        loss=_classifier_loss, eval_sums=_classifier_eval, summarize=_classifier_summary,
        metrics=("loss", "accuracy"), default_metric=("accuracy", "max"),
    )


# ---- character language model ----------------------------------------------------------------------------

def stdlib_corpus(max_chars: int = 400_000) -> str:
    """Docstrings of standard-library modules: real English prose and code, present wherever Python is."""
    import importlib
    import inspect

    modules = ["json", "argparse", "collections", "functools", "itertools", "pathlib", "typing", "logging", "subprocess",
               "threading", "asyncio", "dataclasses", "email", "http.client", "urllib.request", "unittest", "statistics",
               "fractions", "decimal", "random", "string", "textwrap", "difflib", "csv", "zipfile", "tarfile", "shutil"]
    parts = []
    for name in modules:
        module = importlib.import_module(name)
        for _, obj in sorted(vars(module).items()):
            doc = inspect.getdoc(obj) if (inspect.isclass(obj) or inspect.isfunction(obj)) else None
            if doc and getattr(obj, "__module__", "").startswith(name.split(".")[0]):
                parts.append(doc)
    text = "\n\n".join(parts)
    return "".join(c for c in text if c.isascii())[:max_chars]


class CharWindows(Dataset):
    """Fixed, non-overlapping windows of `context + 1` characters (input and next-character target)."""

    def __init__(self, ids: torch.Tensor, context: int):
        self.ids, self.context = ids, context

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.context

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i * self.context: (i + 1) * self.context + 1]
        return chunk[:-1], chunk[1:]


class TinyTransformerLM(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int = 128, layers: int = 2, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(context, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def reset_parameters(self) -> None:
        """Its own tensors (the blocks, embedding and head have their own): what FSDP's meta-device build calls."""
        with torch.no_grad():
            self.position.normal_(0.0, 0.02)
            causal: torch.Tensor = self.causal  # type: ignore[assignment]  # a registered buffer
            causal.copy_(nn.Transformer.generate_square_subsequent_mask(causal.shape[0]))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = self.embed(ids) + self.position[:t]
        causal: torch.Tensor = self.causal  # type: ignore[assignment]  # a registered buffer
        h = self.blocks(h, mask=causal[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def _lm_loss(model: nn.Module, batch: tuple) -> tuple[torch.Tensor, dict[str, int]]:
    x, y = batch
    logits = model(x)
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()), {"samples": len(x), "tokens": y.numel()}


def _lm_eval(model: nn.Module, batch: tuple) -> dict[str, torch.Tensor]:
    x, y = batch
    logits = model(x).float()
    return {"loss_sum": nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"),
            "count": torch.tensor(float(y.numel()), device=y.device)}


def _lm_summary(s: dict[str, float]) -> dict[str, float]:
    loss = s["loss_sum"] / s["count"]
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}


def char_lm(context: int = 64, dim: int = 128, layers: int = 2, heads: int = 4) -> Task:
    text = stdlib_corpus()
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    split = int(len(ids) * 0.9)
    return Task(
        name="char_lm",
        build_model=lambda: TinyTransformerLM(len(vocab), context, dim=dim, layers=layers, heads=heads),
        train_set=CharWindows(ids[:split], context), eval_set=CharWindows(ids[split:], context),
        loss=_lm_loss, eval_sums=_lm_eval, summarize=_lm_summary,
        metrics=("loss", "perplexity"), default_metric=("loss", "min"),
        fsdp_units=transformer_blocks,
        flops_per_token=lambda model: lm_flops_per_token(model, layers, dim, context),
    )


def lm_flops_per_token(model: nn.Module, layers: int, dim: int, context: int) -> float:
    """6 per parameter (2 forward, 4 backward), plus attention's scores and weighted values: 6 * layers * dim * context
    (the PaLM paper's formula, appendix B, which counts the full context; causal masking halves the useful half)."""
    parameters = sum(p.numel() for p in model.parameters())
    return 6.0 * parameters + 6.0 * layers * dim * context


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """One FSDP unit per transformer block: one all-gather per block instead of one per Linear and LayerNorm."""
    blocks: Any = model.blocks  # the bundled LM's nn.TransformerEncoder
    return list(blocks.layers)


def data_checksum(task: Task) -> str:
    """A short content hash of the task's data, for lineage: same hash, same bytes trained on."""
    import hashlib

    digest = hashlib.sha256()
    for dataset in (task.train_set, task.eval_set):
        tensors = getattr(dataset, "tensors", None) or (getattr(dataset, "ids", None),)
        for t in tensors:
            if t is None:
                digest.update(repr((len(dataset), dataset[0])).encode())  # type: ignore[arg-type]  # every task's datasets are sized
            else:
                digest.update(t.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


BUNDLED: dict[str, Callable[[], Task]] = {"classifier": classifier, "char_lm": char_lm}


def load_task(name: str, **args) -> Task:
    """A bundled task by name, or a researcher's own: "package.module:factory" (a function returning a Task).

    A name or arguments that cannot work raise UserError; whatever the factory itself raises is the researcher's
    code failing, and propagates as it is (the worker records its type and message)."""
    import importlib
    import inspect

    from trainforge.trainer.runtime.config import UserError

    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise UserError(f"cannot load task factory {name!r}: {exc}. Fix: an importable 'module:function' that returns a Task") from None
    elif name in BUNDLED:
        factory = BUNDLED[name]
    else:
        raise UserError(f"unknown task {name!r}; bundled tasks: {sorted(BUNDLED)}, or 'module:factory' for your own")
    accepted = set(inspect.signature(factory).parameters)
    unknown = sorted(set(args) - accepted)
    if unknown:
        raise UserError(f"task_args {unknown} are not arguments of {name!r}; it takes {sorted(accepted)}")
    task = factory(**args)
    if not isinstance(task, Task):
        raise UserError(f"{name!r} returned {type(task).__name__}, not a trainforge Task")
    return task
