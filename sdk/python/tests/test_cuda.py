"""The CUDA path: pinned mapping, side-stream copies, restore onto a GPU.
Skipped on machines without one (the development machines so far)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_cuda_tensors_round_trip(client):
    g = torch.Generator(device="cuda").manual_seed(0)
    st = {"w": torch.randn(3 << 20, device="cuda", generator=g), "nc": torch.randn(64, 48, device="cuda", generator=g).t(),
          "bf": torch.randn(1000, device="cuda", generator=g).bfloat16(), "cpu": torch.arange(10),
          "rng": torch.cuda.get_rng_state_all()}
    client.save(1, st)
    step, got = client.restore(map_location="cuda")
    assert step == 1
    for k in ("w", "nc", "bf"):
        assert got[k].is_cuda and torch.equal(got[k], st[k])
    assert got["cpu"].is_cuda and torch.equal(got["cpu"].cpu(), st["cpu"])
    _, on_cpu = client.restore()
    assert not on_cpu["w"].is_cuda and torch.equal(on_cpu["w"], st["w"].cpu())


def test_save_waits_for_queued_kernels(client):
    """The copy is ordered after the work that produced the tensor, and
    save returns only once the bytes are in host memory."""
    x = torch.zeros(1 << 24, device="cuda")
    for _ in range(20):
        x.add_(1)  # queued on the current stream, likely still running
    client.save(1, {"x": x})
    x.add_(1)  # changed after save returned: must not reach the checkpoint
    _, got = client.restore()
    assert torch.equal(got["x"], torch.full((1 << 24,), 20.0))


def test_warm_saves_keep_the_mapping_registered(client):
    t = torch.ones(1 << 20, device="cuda")
    for step in range(1, 5):
        client.save(step, {"t": t * step})
    maps = list(client._segments._maps.values())
    assert maps and all(m.cuda_registered for m in maps)
    _, got = client.restore(map_location="cuda")
    assert torch.equal(got["t"], t * 4)


def test_map_location_of_cuda_tensors(client):
    """Tensors saved from a GPU are recorded as saved on cuda:N and placed
    as torch.load would place them."""
    w = torch.arange(6.0, device="cuda")
    client.save(1, {"w": w, "w2": w.view(2, 3), "cpu": torch.ones(2)})
    for ml, dev in [(None, "cuda"), ({"cuda:0": "cpu"}, "cpu"), ("cpu", "cpu")]:
        _, got = client.restore(map_location=ml)
        assert got["w"].device.type == dev and torch.equal(got["w"].cpu(), w.cpu()), ml
        assert got["w2"].data_ptr() == got["w"].data_ptr(), ml  # one storage, wherever it went
        assert got["cpu"].device.type == "cpu", ml
    seen = []

    def to_gpu(storage, location):
        seen.append(location)
        return storage.cuda(0) if location.startswith("cuda") else None

    _, got = client.restore(map_location=to_gpu)
    assert sorted(seen) == ["cpu", "cuda:0"]
    assert got["w"].is_cuda and torch.equal(got["w"].cpu(), w.cpu()) and not got["cpu"].is_cuda
