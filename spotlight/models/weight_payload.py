"""A policy's trained tensors as one flat buffer: version hand-overs on the device, one payload to ship.

Two moves of weights happen every iteration, and both used to go through per-tensor host copies:

- **Version hand-overs in one process** (θ_old -> θ_{i-1} before an update, `spotlight.loop.policy_versions`):
  `copy_weights` copies the trained tensors of one version into another's with ``torch._foreach_copy_``
  over the two matched lists, on the device they live on. Names and shapes are checked from metadata
  (``tensor.shape`` is host data), so nothing is read back; Qwen-Image's rank-64 LoRA (~755 MB in
  float32) is one device-to-device copy instead of ~2.3 GB of pageable traffic and a sync per tensor.
- **θ_i to another process** (a spot device, an SP group, a generator): `pack_weights` flattens the trained
  tensors, and nothing else (a LoRA policy's A and B matrices; a full fine-tune's parameters, no buffers),
  into one contiguous buffer on the model's device, in the dtype the model samples in (bfloat16 for a
  bfloat16 pipeline: half the bytes, and what its matmuls read anyway), and copies it to the host once,
  into pinned memory without blocking, then waits once for that copy. The `WeightPayload` it returns
  pickles as that one byte array (Ray keeps it out of band: zero-copy from the object store) with its
  `PayloadIndex` (names, shapes, offsets: a few kB, computed once per model and cached). `unpack_into`
  takes it into a policy's existing parameters: one host-to-device copy of the buffer, then one
  ``_foreach_copy_`` from views of it.

A payload is also a ``Mapping`` from names to tensors (views of the buffer, no copy), so code that reads a
policy's ``broadcast_state`` reads a payload the same way. `object_store_mb` sizes Ray's object store from
the payload, and `refuse_full_fine_tune_on_spot` stops a run whose payload no spot device should take.
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["PayloadIndex", "WeightPayload", "copy_weights", "object_store_mb", "pack_weights", "payload_nbytes",
           "refuse_full_fine_tune_on_spot", "sampling_dtype", "trained_tensors", "unpack_into"]

# What Ray's object store holds besides the weights: rollout parts, committed latents, reports. The fixed
# 200 MB store every local node had before was this alone, and it carried the toy runs and the tests.
OBJECT_STORE_MARGIN_MB = 200
# Payloads alive at once: the one spot devices still load while the driver puts the next one.
VERSIONS_IN_FLIGHT = 2


def trained_tensors(model: Any) -> dict[str, torch.Tensor]:
    """The tensors that change under training, live (no copy), under the names ``broadcast_state`` uses.

    A policy that names them itself (``trained_tensors()``: a diffusers policy, a LoRA shadow) is asked;
    otherwise (a TinyDiT, trained in full) they are its ``trainable_parameters()`` by their parameter names.
    """
    own = getattr(model, "trained_tensors", None)
    if callable(own):
        return own()
    trainable = {id(parameter) for parameter in model.trainable_parameters()}
    return {name: parameter for name, parameter in model.named_parameters() if id(parameter) in trainable}


def sampling_dtype(model: Any) -> torch.dtype:
    """The dtype ``model`` samples in: its config's ``torch_dtype`` (a diffusers policy), else its weights'."""
    dtype = getattr(getattr(model, "config", None), "torch_dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    return next(iter(trained_tensors(model).values())).dtype


def _check_fits(targets: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]], what: str) -> None:
    """Refuse weights whose names or shapes (host metadata: no device read) differ from ``targets``'."""
    expected = {name: tuple(tensor.shape) for name, tensor in targets.items()}
    if expected == dict(shapes):
        return
    missing, extra = sorted(set(expected) - set(shapes)), sorted(set(shapes) - set(expected))
    other = sorted(name for name in set(expected) & set(shapes) if expected[name] != tuple(shapes[name]))
    first = (missing or extra or other)[0]
    raise ValueError(f"{what} do not fit this policy ({len(missing)} missing, {len(extra)} unexpected, {len(other)} "
                     f"of another shape, e.g. {first}): send the weights of a policy built from the same config")


def copy_weights(target: Any, source: Any) -> None:
    """``target``'s trained tensors become ``source``'s: one ``_foreach_copy_`` on their device, no host read."""
    targets, sources = trained_tensors(target), trained_tensors(source)
    _check_fits(targets, {name: tuple(tensor.shape) for name, tensor in sources.items()}, "the weights copied")
    with torch.no_grad():
        torch._foreach_copy_(list(targets.values()), [sources[name] for name in targets])


@dataclass(frozen=True)
class PayloadIndex:
    """Where each trained tensor lies in a payload's flat buffer: names, shapes, element offsets, one dtype."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    numel: int
    dtype: str  # a torch dtype's name, e.g. "bfloat16"

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> PayloadIndex:
        """The index of ``tensors`` laid end to end, in their order, as ``dtype``."""
        offsets, total = [], 0
        for tensor in tensors.values():
            offsets.append(total)
            total += tensor.numel()
        return cls(tuple(tensors), tuple(tuple(tensor.shape) for tensor in tensors.values()), tuple(offsets), total,
                   str(dtype).removeprefix("torch."))

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer it describes."""
        return self.numel * self.torch_dtype.itemsize

    def views(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """Each tensor as a view of ``buffer`` (1-D, ``numel`` elements), in index order: no copy."""
        return [buffer[offset:offset + math.prod(shape)].view(shape)
                for offset, shape in zip(self.offsets, self.shapes, strict=True)]


class WeightPayload(Mapping[str, torch.Tensor]):
    """One version's trained tensors in one contiguous host buffer, with the `PayloadIndex` that reads it.

    Items are views of the buffer (no copy). Pickled (``ray.put``) it is the index and the buffer's bytes as
    one numpy array, which Ray stores out of band and maps read-only on the receiving node.
    """

    def __init__(self, index: PayloadIndex, buffer: torch.Tensor) -> None:
        if buffer.dim() != 1 or buffer.numel() != index.numel or buffer.dtype != index.torch_dtype:
            raise ValueError(f"a weight payload's buffer must be 1-D {index.dtype} of {index.numel} elements (got "
                             f"{tuple(buffer.shape)} {buffer.dtype})")
        self.index = index
        self.buffer = buffer
        self._positions = {name: position for position, name in enumerate(index.names)}

    @property
    def nbytes(self) -> int:
        return self.index.nbytes

    def __getitem__(self, name: str) -> torch.Tensor:
        position = self._positions[name]
        offset, shape = self.index.offsets[position], self.index.shapes[position]
        return self.buffer[offset:offset + math.prod(shape)].view(shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self.index.names)

    def __len__(self) -> int:
        return len(self.index.names)

    def __reduce__(self) -> tuple[Any, ...]:
        return _payload_from_bytes, (self.index, self.buffer.view(torch.uint8).numpy())


def _payload_from_bytes(index: PayloadIndex, data: np.ndarray) -> WeightPayload:
    """Unpickle: the bytes (read-only, mapped from Ray's object store) viewed as the index's dtype, no copy."""
    with warnings.catch_warnings():  # never written: the receiver copies out of it
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        raw = torch.from_numpy(data)
    return WeightPayload(index, raw.view(index.torch_dtype))


@dataclass
class _Packer:
    """One model's packing state, kept between iterations: the index and (on a GPU) the pinned host buffer.

    The device buffer is not kept: the caching allocator hands the same block back each iteration, and
    between two packs the memory serves the update instead of holding a copy of the weights.
    """

    signature: tuple[Any, ...]
    index: PayloadIndex
    host_buffer: torch.Tensor | None  # None on a CPU model: it packs straight into a fresh host buffer


_packers: weakref.WeakKeyDictionary[Any, _Packer] = weakref.WeakKeyDictionary()


def _packer(model: Any, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> _Packer:
    device = next(iter(tensors.values())).device
    signature = (dtype, device, tuple((name, tuple(tensor.shape)) for name, tensor in tensors.items()))
    packer = _packers.get(model)
    if packer is None or packer.signature != signature:
        index = PayloadIndex.of(tensors, dtype)
        on_host = device.type == "cpu"
        packer = _Packer(signature, index, None if on_host else torch.empty(index.numel, dtype=dtype, pin_memory=True))
        _packers[model] = packer
    return packer


def pack_weights(model: Any) -> WeightPayload:
    """``model``'s trained tensors, flattened on its device in its sampling dtype, copied to the host once.

    On a GPU the host buffer is pinned and reused from one call to the next (allocating and pinning
    hundreds of MB each iteration would cost more than the copy): the payload is valid until the next
    ``pack_weights`` of the same model, so ship it (``ray.put`` copies it) before packing again. On a CPU
    each call packs into a buffer of its own.
    """
    tensors = trained_tensors(model)
    if not tensors:
        raise ValueError(f"{type(model).__name__} has no trained tensors to ship")
    dtype = sampling_dtype(model)
    packer = _packer(model, tensors, dtype)
    flat = [tensor.detach().reshape(-1) for tensor in tensors.values()]
    if packer.host_buffer is None:
        host = torch.empty(packer.index.numel, dtype=dtype)
        torch.cat(flat, out=host)  # one pass, cast to the sampling dtype on the way
        return WeightPayload(packer.index, host)
    device_buffer = torch.empty(packer.index.numel, dtype=dtype, device=flat[0].device)
    torch.cat(flat, out=device_buffer)
    packer.host_buffer.copy_(device_buffer, non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(device_buffer.device))  # the stream the copy was queued on
    done.synchronize()  # the one wait: the bytes must be on the host before anyone reads them
    return WeightPayload(packer.index, packer.host_buffer)


def unpack_into(model: Any, payload: WeightPayload) -> None:
    """Take ``payload`` into ``model``'s trained tensors: one copy of the buffer to their device, one
    ``_foreach_copy_`` out of it (cast to the parameters' own dtype); names and shapes checked from the index."""
    targets = trained_tensors(model)
    index = payload.index
    if tuple(targets) != index.names or tuple(tuple(tensor.shape) for tensor in targets.values()) != index.shapes:
        _check_fits(targets, dict(zip(index.names, index.shapes, strict=True)), "the shipped weights")
    device = next(iter(targets.values())).device
    buffer = payload.buffer if device.type == "cpu" else payload.buffer.to(device, non_blocking=True)
    with torch.no_grad():
        torch._foreach_copy_([targets[name] for name in index.names], index.views(buffer))


def payload_nbytes(model: Any) -> int:
    """Bytes `pack_weights` ships for ``model`` each iteration, from metadata alone."""
    return sum(tensor.numel() for tensor in trained_tensors(model).values()) * sampling_dtype(model).itemsize


def object_store_mb(payload_bytes: int, versions_in_flight: int = VERSIONS_IN_FLIGHT,
                    margin_mb: int = OBJECT_STORE_MARGIN_MB) -> int:
    """Ray object store (MB per node) for payloads of ``payload_bytes``: the versions alive at once, plus a margin
    for everything else the store carries, so a payload never spills to disk."""
    return math.ceil(payload_bytes * versions_in_flight / 2**20) + margin_mb


# What a spot device may take per iteration: above any LoRA of the published models (Qwen-Image's rank-64 LoRA is
# ~0.4 GB in bf16), far below a whole transformer (SD3.5-M 4.9 GB); a small model fine-tuned in full ships under it.
SPOT_PAYLOAD_LIMIT_BYTES = 2**30


def refuse_full_fine_tune_on_spot(model: Any, spot_devices: int) -> None:
    """Raise `RunError` (one line, the cost in bytes) for a fully fine-tuned pipeline transformer with spot devices
    whose payload is over `SPOT_PAYLOAD_LIMIT_BYTES`.

    Why refused rather than streamed: every iteration each spot device would take the whole transformer
    (SD3.5-M 4.9 GB, Qwen-Image 41 GB in bfloat16; a LoRA is a few hundred MB), every node's object store
    must hold two of them, and a preempted device's replacement fetches it again before it helps. A spot
    device earns its keep by exploring seeds while the trainer trains; no such round pays for moving a
    model of that size to it. A TinyDiT, trained in full by design, ships its few MB and is not concerned.
    """
    config = getattr(model, "config", None)
    if spot_devices <= 0 or getattr(config, "finetune", None) != "full":
        return
    shipped = payload_nbytes(model)
    if shipped <= SPOT_PAYLOAD_LIMIT_BYTES:  # a small transformer: shipped like a LoRA
        return
    from spotlight.run_error import RunError

    raise RunError(f"full fine-tune ships {_size(shipped)} per iteration to each spot device (over the "
                   f"{_size(SPOT_PAYLOAD_LIMIT_BYTES)} one takes); use LoRA (model.finetune lora) or mode vanilla")


def _size(nbytes: int) -> str:
    """Bytes for a person: GB from one upward, else MB."""
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"
