"""The ops' eager entry points: each op overload's own C++ callable, one Python frame less per call.

``torch.ops.pointops.X.default(...)`` runs ``OpOverload.__call__``, a Python frame whose only work
is ``self._op(*args, **kwargs)``: the C++ callable that binds the arguments to the schema and
enters the dispatcher. At a training step's sizes the host time is the cost, and that
frame is ~0.2-0.4 µs of a 2-5 µs call. The fronts call ``_op`` itself. It is the same dispatcher
entry, so nothing changes for the op's users: ``__torch_function__`` overrides, dispatch modes
(FakeTensorMode, make_fx) and autograd all receive the OpOverload, as before.

torch.compile cannot trace a pybind builtin, so each entry is registered with
``torch.compiler.substitute_in_graph``: Dynamo traces it as a call of the OpOverload, and the
compiled graph holds ``torch.ops.pointops.X.default`` as it did. On a torch without either piece
(``_op`` is private; ``substitute_in_graph`` came in torch 2.5) the OpOverload itself is returned.
"""
import torch


def eager_entry(overload):
    """The callable the fronts call for ``overload`` (an OpOverload): its C++ entry where
    torch.compile can be told to trace that entry as the overload, else the overload itself."""
    fast = getattr(overload, "_op", None)
    substitute = getattr(torch.compiler, "substitute_in_graph", None)
    if fast is None or substitute is None:
        return overload

    def traced_as_the_overload(*args, **kwargs):
        return overload(*args, **kwargs)

    substitute(fast, skip_signature_check=True)(traced_as_the_overload)
    return fast
