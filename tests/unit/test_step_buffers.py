"""The runner's static step buffers (synth/runner.py StepBuffers): every row of a step's inputs starts 16 bytes
aligned whatever the batch, so that the Triton kernels that take those rows as pointers are the same kernels (the same
specialization) for every engine and lane, and one set of compile helpers serves them all."""
from __future__ import annotations

import pytest
import torch

from talkgate.synth.runner import StepBuffers, input_columns


@pytest.mark.parametrize("rows", [1, 2, 206, 255, 512])
def test_each_inputs_row_starts_16_bytes_aligned(rows):
    inputs = StepBuffers.zeros(rows, 8, torch.float32, 4).inputs
    assert inputs.shape[1] == input_columns(rows) >= rows
    assert all((inputs[i].data_ptr() - inputs[0].data_ptr()) % 16 == 0 for i in range(4))
