"""Where the Python fronts need to know whether a torch.func transform or forward-mode AD is in play.

Most ops need nothing here: their C++ Autograd kernels see the transform on the tensors themselves
(csrc/common/transforms.h). The fronts ask only where Python itself must act differently: checks that
read tensor values (a host read that vmap cannot batch), ``particle_sum``'s torch.autograd.Function
(pointops/_particle_sum_function.py), ``out=`` (refused under a transform), and the packed ops whose
output sizes depend on the values (refused under vmap).
"""
import torch
import torch.autograd.forward_ad as _forward_ad

_functorch_active = torch._C._are_functorch_transforms_active


def transform_active() -> bool:
    """True inside any torch.func transform (vmap, grad, jvp, ...) or a forward-mode AD level."""
    return _functorch_active() or _forward_ad._current_level >= 0


def vmap_active() -> bool:
    """True inside torch.vmap (at any level of the transforms running)."""
    if not _functorch_active():
        return False
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    from torch._C._functorch import TransformType

    return any(i.key() == TransformType.Vmap for i in retrieve_all_functorch_interpreters())


def refuse_under_vmap(op: str, instead: str) -> None:
    """The clear error of an op whose output sizes depend on its input values (edge counts)."""
    if vmap_active():
        raise RuntimeError(f"pointops.{op} cannot run under torch.vmap: the size of its output depends on the "
                           f"values of its inputs, which vmap cannot batch; {instead}")
