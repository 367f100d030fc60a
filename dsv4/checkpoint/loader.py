"""Validating, streaming safetensors reader for DeepSeek-V4 checkpoints (official or transformers layout).

`Checkpoint.open` checks everything that can be checked without the model (files, headers against
file sizes, names, shapes, dtypes, expert dtype, every block scale) *before* any weight is handed
out, so a bad checkpoint never produces a half-loaded model. Weights are then streamed one tensor
at a time from memory-mapped shards (tensors are zero-copy views of the mapping); a shard is
unmapped as soon as iteration moves past it, so resident memory stays around one shard plus
whatever the consumer keeps.
Spec: checkpoint_format.md §2–§4, §10–§12; deepseek_v4_model.md §1.4.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import safe_open
from tqdm import tqdm

from dsv4.checkpoint.errors import CheckpointError
from dsv4.checkpoint.naming import (
    SAFETENSORS_DTYPES, SCALE_DTYPE, Part, TensorSpec, expected_inventory, is_mtp_name,
    is_routed_expert_name, is_scale_name, name_layout, transformers_to_official,
)
from dsv4.config import ModelConfig

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit
# DSpark drafter (Flash-0731): replaces the MTP namespace with mtp.0..mtp.2 and extra heads (§12).
_LATER_VARIANT_MTP = re.compile(r"^mtp\.(?:[1-9]\d*\.|0\.(?:main_proj|main_norm|markov|confidence))")

TensorFilter = Callable[[str], bool] | str | None


@dataclass(frozen=True)
class StoredTensor:
    """One entry of a shard header."""
    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Source:
    """Where an official tensor comes from: a stored tensor, or a piece of a merged one."""
    stored: StoredTensor
    part: Part | None
    shape: tuple[int, ...]

    @property
    def dtype(self) -> str:
        return self.stored.dtype

    def where(self, name: str) -> str:
        """The file (and the stored name, where it differs from `name`) for error messages."""
        if self.part is not None:
            return f"{self.stored.file} [{self.stored.name}, expert {self.part.expert}]"
        return str(self.stored.file) + (f" [{self.stored.name}]" if self.stored.name != name else "")


def _fail(msg: str) -> CheckpointError:
    return CheckpointError(msg)


def _examples(names: list[str], n: int = 5) -> str:
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more


# ---- files and headers -----------------------------------------------------------------------

def read_header(path: Path) -> dict[str, StoredTensor]:
    """Parse and check a safetensors header against the file size (no tensor data is read)."""
    size = path.stat().st_size
    if size < 8:
        raise _fail(f"{path}: truncated safetensors file ({size} bytes, no header)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise _fail(f"{path}: corrupt or truncated safetensors file: header length {n} "
                        f"but the file has {size} bytes")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _fail(f"{path}: corrupt safetensors header (not JSON: {e})") from None
    if not isinstance(header, dict):
        raise _fail(f"{path}: corrupt safetensors header (not a JSON object)")
    data_size = size - 8 - n
    out: dict[str, StoredTensor] = {}
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise _fail(f"{path}: corrupt header entry for tensor {name}: {entry!r}") from None
        if dtype not in SAFETENSORS_DTYPES:
            raise _fail(f"{path}: tensor {name} has unsupported dtype {dtype}")
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise _fail(f"{path}: tensor {name} has invalid shape {list(shape)}")
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dtype][1]
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end) or end - begin != nbytes:
            raise _fail(f"{path}: tensor {name}: data_offsets [{begin}, {end}] do not match "
                        f"{dtype} {list(shape)} ({nbytes} bytes)")
        if end > data_size:
            raise _fail(f"{path}: truncated: tensor {name} needs data bytes [{begin}, {end}) "
                        f"but the file holds only {data_size} data bytes")
        spans.append((begin, end, name))
        out[name] = StoredTensor(path, name, dtype, shape)
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            raise _fail(f"{path}: corrupt: tensor {name} starts at data byte {begin}, expected {pos} "
                        "(overlapping or gapped data_offsets)")
        pos = end
    if pos != data_size:
        raise _fail(f"{path}: corrupt: tensors cover {pos} data bytes but the file holds {data_size}")
    return out


def _discover(root: Path) -> dict[str, StoredTensor]:
    """All stored tensors by stored name, following the index if there is one."""
    if not root.is_dir():
        raise _fail(f"{root}: not a directory")
    index_path = root / INDEX_FILE
    if index_path.exists():
        try:
            index = json.loads(index_path.read_text())
            weight_map = index["weight_map"]
            assert isinstance(weight_map, dict)
        except (json.JSONDecodeError, KeyError, AssertionError, TypeError) as e:
            raise _fail(f"{index_path}: not a valid safetensors index ({e!r})") from None
        files = sorted(set(weight_map.values()))
        for fname in files:
            if not (root / fname).is_file():
                first = next(k for k, v in weight_map.items() if v == fname)
                raise _fail(f"{index_path}: tensor {first} maps to missing file {fname}")
    else:
        weight_map = None
        files = sorted(p.name for p in root.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in root.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise _fail(f"{root}: only pickle-based weights found ({_examples(pickles, 3)}); dsv4 loads "
                        "safetensors only and never unpickles files. Convert them to safetensors first.")
        raise _fail(f"{root}: no *.safetensors weights and no {INDEX_FILE}")

    headers = {fname: read_header(root / fname) for fname in files}
    stored: dict[str, StoredTensor] = {}
    if weight_map is not None:
        for name, fname in weight_map.items():
            st = headers[fname].get(name)
            if st is None:
                raise _fail(f"{index_path}: tensor {name} is mapped to {fname}, which does not contain it")
            stored[name] = st
        extra = sorted(n for f, h in headers.items() for n in h if weight_map.get(n) != f)
        if extra:
            log.warning("%s: %d tensors in shards are not in the index and are ignored: %s",
                        root, len(extra), _examples(extra))
    else:
        for fname, header in headers.items():
            for name, st in header.items():
                if name in stored:
                    raise _fail(f"{root}: tensor {name} appears in both {stored[name].file.name} and {fname}")
                stored[name] = st
    for fname in files:  # make sure the safetensors library itself accepts every shard
        try:
            with safe_open(str(root / fname), framework="pt"):
                pass
        except Exception as e:  # noqa: BLE001 - any failure here is a corrupt file
            raise _fail(f"{root / fname}: safetensors cannot open this file: {e}") from None
    return stored


# ---- names and layout ------------------------------------------------------------------------

def _official_sources(root: Path, stored: dict[str, StoredTensor]) -> tuple[str, dict[str, Source], list[str]]:
    """Map stored tensors to official names. Returns (layout, sources, unknown stored names)."""
    layouts = {name: name_layout(name) for name in stored}
    official = sorted(n for n, l in layouts.items() if l == "official")
    tf = sorted(n for n, l in layouts.items() if l == "transformers")
    if official and tf:
        raise _fail(f"{root}: mixed tensor naming: official names (e.g. {official[0]} in "
                    f"{stored[official[0]].file.name}) and transformers names (e.g. {tf[0]} in "
                    f"{stored[tf[0]].file.name}); a checkpoint must use one layout")
    layout = "transformers" if tf else "official"
    unknown = sorted(n for n, l in layouts.items() if l is None)
    sources: dict[str, Source] = {}
    for name, st in stored.items():
        if layouts[name] is None:
            continue
        if layouts[name] == "either" or layout == "official":
            pieces = [(name, None)]
        else:
            try:
                pieces = transformers_to_official(name, st.shape)
            except ValueError as e:
                raise _fail(f"{st.file}: {e}") from None
        for official_name, part in pieces:
            if official_name in sources:
                first = sources[official_name].where(official_name)
                raise _fail(f"{root}: tensor {official_name} is stored twice ({first} and {st.file} [{name}])")
            shape = part.shape(st.shape) if part is not None else st.shape
            sources[official_name] = Source(st, part, shape)
    return layout, sources, unknown


def _header_expert_dtype(sources: dict[str, Source]) -> str | None:
    dtypes = {s.dtype for n, s in sources.items() if is_routed_expert_name(n) and n.endswith(".weight")}
    return {frozenset({"I8"}): "fp4", frozenset({"F8_E4M3"}): "fp8"}.get(frozenset(dtypes))


def _dtype_ok(expected: str, found: str) -> bool:
    return found == expected or (expected == "F8_E8M0" and found == "U8")  # raw E8M0 bytes


class Checkpoint:
    """A validated checkpoint directory. Use `Checkpoint.open(path)`."""

    def __init__(self, root: Path, config: ModelConfig, layout: str, sources: dict[str, Source],
                 specs: dict[str, TensorSpec], include_mtp: bool, progress: bool):
        self.path = root
        self.config = config
        self.layout = layout  # "official" or "transformers"
        self.specs = specs    # official name -> expected TensorSpec (== what is stored)
        self.include_mtp = include_mtp
        self.progress = progress
        self._sources = sources
        self._handles: dict[Path, object] = {}
        self.f32_scales_pow2: bool | None = None  # set by the scale check when float32 scales exist

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, include_mtp: bool | None = True, progress: bool = True,
             check_scales: bool = True) -> "Checkpoint":
        """Open and fully validate a checkpoint directory; raises CheckpointError on any problem.

        include_mtp: True = the MTP block must be present and is validated/loadable; False = `mtp.*`
        tensors are skipped; None = include it iff the checkpoint has MTP tensors.
        """
        root = Path(path)
        if not root.is_dir():
            raise _fail(f"{root}: not a directory")
        try:
            cfg = ModelConfig.from_file(root / "config.json")
        except FileNotFoundError:
            raise _fail(f"{root}: no config.json") from None
        except ValueError as e:
            raise _fail(str(e)) from None
        stored = _discover(root)
        layout, sources, unknown = _official_sources(root, stored)

        later = sorted(n for n in sources if _LATER_VARIANT_MTP.match(n))
        if later:
            log.warning("%s: found a later-variant drafter namespace (%s); it is not supported and is "
                        "ignored together with all mtp.* tensors", root, _examples(later, 2))
        has_mtp = any(is_mtp_name(n) for n in sources) and not later
        if include_mtp is None:
            include_mtp = has_mtp
        include_mtp = bool(include_mtp and cfg.num_nextn_predict_layers and not later)
        if later or not include_mtp:
            sources = {n: s for n, s in sources.items() if not is_mtp_name(n)}

        if cfg.is_quantized:
            found = _header_expert_dtype(sources)
            if found and found != cfg.expert_dtype:
                log.warning("%s: config.json says expert_dtype=%r but the routed experts are stored as %s; "
                            "using expert_dtype=%r (the safetensors header wins)",
                            root, cfg.expert_dtype, "I8 (MXFP4)" if found == "fp4" else "F8_E4M3", found)
                cfg = dataclasses.replace(cfg, expert_dtype=found, raw={**cfg.raw, "expert_dtype": found})

        specs = expected_inventory(cfg, include_mtp=include_mtp)
        cls._check_names(root, specs, sources, unknown, stored, include_mtp)
        cls._check_shapes(cfg, specs, sources)
        ckpt = cls(root, cfg, layout, sources, specs, include_mtp, progress)
        if check_scales:
            ckpt._check_scales()
            ckpt.close()
        log.info("%s: %s layout, %d tensors, expert_dtype=%s, mtp=%s", root, layout, len(specs),
                 cfg.expert_dtype, include_mtp)
        return ckpt

    @staticmethod
    def _check_names(root: Path, specs: dict[str, TensorSpec], sources: dict[str, Source], unknown: list[str],
                     stored: dict[str, StoredTensor], include_mtp: bool) -> None:
        unexpected = sorted(set(sources) - set(specs))
        if unknown or unexpected:
            names = [f"{n} ({stored[n].file.name})" for n in unknown] + \
                    [f"{n} ({sources[n].where(n)})" for n in unexpected]
            raise _fail(f"{root}: {len(names)} unexpected tensors not implied by config.json: "
                        f"{_examples(names)}")
        missing = [n for n in specs if n not in sources]
        if missing:
            hint = (" (pass include_mtp=False to load without the MTP block)"
                    if include_mtp and all(is_mtp_name(n) for n in missing) else "")
            raise _fail(f"{root}: {len(missing)} missing tensors: {_examples(missing)}{hint}")

    @staticmethod
    def _check_shapes(cfg: ModelConfig, specs: dict[str, TensorSpec], sources: dict[str, Source]) -> None:
        linear_scale = SCALE_DTYPE[cfg.linear_scale_dtype]
        for name, spec in specs.items():
            src = sources[name]
            if tuple(src.shape) != spec.shape:
                raise _fail(f"{src.where(name)}: tensor {name} has shape {list(src.shape)}, "
                            f"expected {list(spec.shape)}")
            if _dtype_ok(spec.dtype, src.dtype):
                continue
            if is_scale_name(name) and not is_routed_expert_name(name) and spec.dtype == linear_scale \
                    and src.dtype in SCALE_DTYPE.values():
                raise _fail(f"{src.where(name)}: tensor {name}: linear block scale stored as {src.dtype}, but "
                            f"expert_dtype={cfg.expert_dtype!r} requires {spec.dtype} "
                            "(E8M0 scales go with fp4 experts, float32 scales with fp8 experts)")
            raise _fail(f"{src.where(name)}: tensor {name} has dtype {src.dtype}, expected {spec.dtype}")

    def _check_scales(self) -> None:
        """Every block scale must be a finite positive number (E8M0 byte 255 is NaN).

        Also records whether all float32 scales are powers of two (Flash-Base ships UE8M0 values
        as float32: then converting them to E8M0 is exact; otherwise they must stay float32).
        """
        names = [n for n in self.specs if is_scale_name(n)]
        not_pow2 = []
        for name in tqdm(names, desc="checking scales", unit="tensor", file=sys.stderr,
                         disable=not self.progress or not names, leave=False):
            t = self._read(name)
            if self.specs[name].dtype == "F8_E8M0":
                bad = t.view(torch.uint8) == 255
                what = "NaN E8M0 scale bytes (255)"
            else:
                bad = ~torch.isfinite(t) | (t <= 0)
                what = "non-finite or non-positive scales"
            if bool(bad.any()):
                idx = tuple(int(i) for i in bad.nonzero()[0])
                raise _fail(f"{self._sources[name].where(name)}: tensor {name} has {int(bad.sum())} "
                            f"{what}, first at index {list(idx)}")
            if t.dtype == torch.float32 and not bool((torch.frexp(t).mantissa == 0.5).all()):
                not_pow2.append(name)
        self.f32_scales_pow2 = not not_pow2 if any(self.specs[n].dtype == "F32" for n in names) else None
        if not_pow2:
            log.warning("%s: %d float32 block-scale tensors are not all powers of two (e.g. %s); they are "
                        "kept as float32", self.path, len(not_pow2), _examples(not_pow2, 3))

    # ---- reading -----------------------------------------------------------------------
    def _handle(self, file: Path):
        h = self._handles.get(file)
        if h is None:
            h = self._handles[file] = safe_open(str(file), framework="pt")
        return h

    def _read(self, name: str) -> torch.Tensor:
        src = self._sources[name]
        try:
            h = self._handle(src.stored.file)
            if src.part is None:
                t = h.get_tensor(src.stored.name)
            else:
                t = src.part.take_from_expert(h.get_slice(src.stored.name)[src.part.expert])
        except Exception as e:  # noqa: BLE001
            raise _fail(f"{src.stored.file}: cannot read tensor {src.stored.name}: {e}") from None
        if src.dtype == "U8" and self.specs[name].dtype == "F8_E8M0":
            t = t.view(torch.float8_e8m0fnu)
        return t

    @property
    def tensor_names(self) -> list[str]:
        return list(self.specs)

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.specs.values())

    @property
    def expert_dtype(self) -> str:
        return self.config.expert_dtype

    def get(self, name: str) -> torch.Tensor:
        if name not in self.specs:
            raise KeyError(f"{self.path}: no tensor {name!r}")
        return self._read(name)

    def iter_tensors(self, filter: TensorFilter = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (official name, tensor) one at a time, shard by shard.

        filter: None (everything), a name prefix (e.g. "mtp." or "layers.3."), or a predicate
        (e.g. `naming.is_main_name` to skip the MTP block).
        """
        if filter is None:
            names = list(self.specs)
        elif isinstance(filter, str):
            names = [n for n in self.specs if n.startswith(filter)]
        else:
            names = [n for n in self.specs if filter(n)]
        names.sort(key=lambda n: str(self._sources[n].stored.file))  # stable: keeps order within a file
        bar = tqdm(total=len(names), desc="loading weights", unit="tensor", file=sys.stderr,
                   disable=not self.progress)
        try:
            for i, name in enumerate(names):
                yield name, self._read(name)
                bar.update()
                file = self._sources[name].stored.file
                if i + 1 == len(names) or self._sources[names[i + 1]].stored.file != file:
                    # done with this shard: drop our mapping, so its pages leave RSS once the
                    # consumer has dropped the tensors (peak RSS ~ one shard, not the checkpoint)
                    self._handles.pop(file, None)
        finally:
            bar.close()

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Checkpoint({str(self.path)!r}, layout={self.layout}, tensors={len(self.specs)}, "
                f"expert_dtype={self.expert_dtype}, mtp={self.include_mtp})")


def load_state(path: str | Path, *, include_mtp: bool | None = True, progress: bool = False) -> dict[str, torch.Tensor]:
    """Validate and load a whole checkpoint into a dict official name -> tensor (small models only)."""
    with Checkpoint.open(path, include_mtp=include_mtp, progress=progress) as ckpt:
        return dict(ckpt.iter_tensors())
