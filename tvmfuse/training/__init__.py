"""Training for Relax graphs: `train_step(mod, num_params, loss=..., optimizer=...)` builds
forward, `relax.transform.Gradient` and a `relax.training` optimizer into one Relax module that
tvmfuse.build compiles like any other (relax_train.py; the gradients TVM lacks: gradients.py).
Training through torch.compile is frontends/torch_train.py."""
from .relax_train import TrainStep, train_step

__all__ = ["TrainStep", "train_step"]
