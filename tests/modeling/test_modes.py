"""`evaluating` turns dropout off for a block and restores each submodule's mode afterwards."""

import torch
from torch import nn

from bertforge.modeling.modes import evaluating


def test_evaluating_restores_each_submodules_mode():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Sequential(nn.Dropout(0.5)))
    model.train()
    model[2].eval()  # a frozen part stays frozen afterwards
    x = torch.ones(2, 4)
    with evaluating(model):
        assert not any(m.training for m in model.modules())
        assert torch.equal(model(x), model(x))  # no dropout inside the block
    assert model.training and model[1].training and not model[2].training and not model[2][0].training


def test_evaluating_restores_after_an_error():
    model = nn.Dropout(0.5).train()
    try:
        with evaluating(model):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert model.training
