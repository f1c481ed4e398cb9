"""rewind.dcp needs torch 2.x; the rest of the SDK does not."""

import importlib

import pytest
import torch

import rewind


def test_rewind_imports_without_dcp():
    assert rewind.Client is not None and "dcp" not in rewind.__all__


@pytest.mark.skipif(int(torch.__version__.split(".")[0]) >= 2, reason="torch 2.x has the DCP interface")
def test_dcp_on_torch_1_is_a_clear_import_error():
    with pytest.raises(ImportError, match=r"rewind\.dcp needs torch 2\.x"):
        importlib.import_module("rewind.dcp")
