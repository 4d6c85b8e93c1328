"""A forward written down layer by layer: every parameter's shape and the FLOPs torch's counter would count.

`torch.utils.flop_counter.FlopCounterMode` counts matrix products only (``mm``, ``addmm``, ``bmm``,
convolutions; elementwise work, norms and softmax are free), so a model's FLOPs are the sum over its
Linears, convolutions and attention products of 2 x (multiply-adds). A family's module
(`spotlight.sim.planning.analytic.mmdit`, ...) walks its diffusers forward and calls `Trace.linear`,
`Trace.conv` and `Trace.attention` with the rows each sees; the trace records the parameter shapes under
the names diffusers and peft give them, so the counts equal the meta-device count of the built model.

A backward is counted as autograd runs it: a product's input gradient only where that input needs one,
its weight gradient only where the weight is trained. Each call takes whether its input needs a gradient
and returns whether its output does; the family's walk carries these flags along its streams. With LoRA
only the adapters are trained (peft's ``lora_A`` / ``lora_B``, rank r, no bias, dropout 0), so the
activations before the first adapter need no gradient and the frozen base Linears there cost nothing
in the backward; with full fine-tuning every weight is trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["NotAnalytic", "Trace"]


class NotAnalytic(Exception):
    """The config or the LoRA targets take a path the analytic walk does not model: count on the meta device."""


@dataclass
class Trace:
    """Parameters and FLOPs of one forward (and, with gradients, its backward) of ``batch`` samples.

    ``lora``: (rank, target module names) with LoRA, None for full fine-tuning (every weight trained).
    """

    batch: int
    lora: tuple[int, tuple[str, ...]] | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    forward: int = 0
    backward: int = 0
    linears: set[str] = field(default_factory=set)
    others: set[str] = field(default_factory=set)  # modules with weights that peft could not wrap as a Linear

    @property
    def full(self) -> bool:
        """Whether every base weight is trained (no LoRA)."""
        return self.lora is None

    def targeted(self, module: str) -> bool:
        """Whether peft puts an adapter on ``module``: a target equal to its name or ending it after a dot."""
        return self.lora is not None and any(module == t or module.endswith(f".{t}") for t in self.lora[1])

    def param(self, name: str, *shape: int) -> bool:
        """Record a weight that no product reads (a norm's scale, a modulation table); whether it is trained."""
        self.shapes[name] = tuple(shape)
        self.others.add(name.rpartition(".")[0])
        return self.full

    def _product(self, flops: int, input_grad: bool, weight_grad: bool, live: bool = True) -> None:
        self.forward += flops
        if live:
            self.backward += flops * (int(input_grad) + int(weight_grad))

    def linear(self, name: str, fan_in: int, fan_out: int, rows: int, grad: bool, bias: bool = True,
               live: bool = True) -> bool:
        """``name``: nn.Linear(fan_in, fan_out) over ``rows`` rows whose input needs a gradient when ``grad``.

        ``live``: whether its output reaches the model's output (a dead end gets no backward at all)."""
        lora = self.targeted(name)
        base = f"{name}.base_layer" if lora else name
        self.shapes[f"{base}.weight"] = (fan_out, fan_in)
        if bias:
            self.shapes[f"{base}.bias"] = (fan_out,)
        self.linears.add(name)
        self._product(2 * rows * fan_in * fan_out, grad, self.full, live)
        if not lora:
            return grad or self.full
        assert self.lora is not None
        rank = self.lora[0]
        self.shapes[f"{name}.lora_A.default.weight"] = (rank, fan_in)
        self.shapes[f"{name}.lora_B.default.weight"] = (fan_out, rank)
        self._product(2 * rows * fan_in * rank, grad, True, live)  # A: trained; its input's gradient if needed
        self._product(2 * rows * rank * fan_out, True, True, live)  # B: its input (A's output) needs one
        return True

    def conv(self, name: str, channels_in: int, channels_out: int, kernel: tuple[int, ...], positions: int,
             grad: bool, bias: bool = True) -> bool:
        """A convolution of ``kernel`` producing ``positions`` outputs per sample (all samples: x batch)."""
        if self.targeted(name):
            raise NotAnalytic(f"LoRA on the convolution {name}")
        self.shapes[f"{name}.weight"] = (channels_out, channels_in, *kernel)
        if bias:
            self.shapes[f"{name}.bias"] = (channels_out,)
        self.others.add(name)
        self._product(2 * self.batch * positions * channels_out * channels_in * math.prod(kernel), grad, self.full)
        return grad or self.full

    def attention(self, heads: int, queries: int, keys: int, head_dim: int, q: bool, k: bool, v: bool) -> bool:
        """Scaled dot-product attention per sample as its maths decomposition runs: S = Q Kᵀ, then P V."""
        flops = 2 * self.batch * heads * queries * keys * head_dim
        self._product(flops, q, k)  # Q Kᵀ
        self._product(flops, q or k, v)  # softmax(S) V
        return q or k or v

    def check_targets(self) -> None:
        """NotAnalytic unless every LoRA target names at least one Linear and nothing else with weights (what
        peft would wrap, refuse or not find is then the walk's Linears alone)."""
        if self.lora is None:
            return
        modules = self.linears | self.others
        containers = {name[:i] for name in modules for i, char in enumerate(name) if char == "."}
        for target in self.lora[1]:
            def hit(module: str, target: str = target) -> bool:
                return module == target or module.endswith(f".{target}")

            if not any(hit(m) for m in self.linears) or any(hit(m) for m in (self.others | containers) - self.linears):
                raise NotAnalytic(f"LoRA target {target!r}")

    @property
    def parameters(self) -> int:
        """The model's own parameters (the adapters left out)."""
        return sum(math.prod(s) for name, s in self.shapes.items() if ".lora_" not in name)

    @property
    def lora_parameters(self) -> int:
        return sum(math.prod(s) for name, s in self.shapes.items() if ".lora_" in name)
