"""inalab.models.from_torch: the user's own PyTorch model as a profile a scenario can name (issue #20)."""
import json

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import inalab  # noqa: E402
from inalab.config import ConfigError, load_scenario  # noqa: E402
from inalab.models import Layer, ModelProfile, from_torch, get_model, load_profile  # noqa: E402

FAST = {"warmup": 1, "repeat": 3}


class Net(nn.Module):
    """A conv layer with BN, then a small MLP. fc2 is registered before fc1 on purpose: the
    profile's order must follow the computation, not the registration."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.fc2 = nn.Linear(64, 10)
        self.fc1 = nn.Linear(8 * 4 * 4, 64)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def numel(*modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return Net()


@pytest.fixture(scope="module")
def x():
    return torch.randn(4, 3, 8, 8)


@pytest.fixture(scope="module")
def saved(net, x, tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "net.json"
    return from_torch(net, x, path, name="net", **FAST), path


def test_params_exact_per_layer_and_in_total(net, saved):
    profile, _ = saved
    assert isinstance(profile, ModelProfile) and all(isinstance(l, Layer) for l in profile.layers)
    # Default grouping: conv+BN is one layer named after the conv, as in the catalog.
    assert [l.name for l in profile.layers] == ["conv", "fc1", "fc2"]
    assert [l.params for l in profile.layers] == [3 * 8 * 9 + 8 + 8 + 8, 128 * 64 + 64, 64 * 10 + 10]
    assert [l.params for l in profile.layers] == [numel(net.conv, net.bn), numel(net.fc1), numel(net.fc2)]
    assert profile.total_params == sum(p.numel() for p in net.parameters()) == 9146
    assert profile.total_bytes == 4 * 9146 == sum(l.bytes for l in profile.layers)
    assert [w["bytes"] for w in profile.to_workload()] == [4 * l.params for l in profile.layers]


def test_times_positive_and_sum_to_the_iteration(saved):
    profile, _ = saved
    for l in profile.layers:
        assert 0 < l.fwd_s < 1 and 0 < l.bwd_s < 1, l
    assert profile.iteration_compute_s == pytest.approx(profile.fwd_s + profile.bwd_s, rel=1e-12)
    assert profile.batch_size == 4 and profile.reference_gpu.startswith("CPU")
    assert "median of 3 timed iterations after 1 warm-up" in profile.source


def test_group_options(net, x):
    by_module = from_torch(net, x, group="module", warmup=0, repeat=1)
    assert [(l.name, l.params) for l in by_module.layers] == [
        ("conv", numel(net.conv)), ("bn", numel(net.bn)), ("fc1", numel(net.fc1)), ("fc2", numel(net.fc2))]

    seq = nn.Sequential(nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5)), nn.ReLU(),
                        nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 3)))
    depth1 = from_torch(seq, torch.randn(2, 6), group=1, warmup=0, repeat=1)
    assert [(l.name, l.params) for l in depth1.layers] == [("0", numel(seq[0])), ("2", numel(seq[2]))]
    default = from_torch(seq, torch.randn(2, 6), warmup=0, repeat=1)  # LayerNorm joins its Linear
    assert [(l.name, l.params) for l in default.layers] == [("0.0", numel(seq[0])), ("2.0", 24), ("2.1", 15)]
    assert sum(l.params for l in default.layers) == numel(seq)


def test_frozen_parameters_are_left_out(x):
    torch.manual_seed(0)
    net = Net()
    net.conv.requires_grad_(False)
    profile = from_torch(net, x, warmup=0, repeat=1)
    assert [(l.name, l.params) for l in profile.layers] == [("bn", 16), ("fc1", 8256), ("fc2", 650)]


def test_saved_file_loads_back_through_the_catalog_loader(saved):
    profile, path = saved
    raw = json.loads(path.read_text())
    assert raw["schema"] == "inalab.models.profile/1"
    assert [l["name"] for l in raw["layers"]] == ["conv", "fc1", "fc2"]  # forward order in the file
    assert raw["measurement"]["backward_order"] == ["fc2", "fc1", "conv"]
    assert get_model(str(path)) == profile == load_profile(path)
    assert get_model(path).scaled(0.5).total_bytes == profile.total_bytes


def test_model_left_as_it_was(x):
    torch.manual_seed(0)
    net = Net().eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    threads = torch.get_num_threads()
    rng = torch.random.get_rng_state()
    from_torch(net, x, threads=1, warmup=0, repeat=1)
    assert not net.training and not net.bn.training
    assert all(p.grad is None for p in net.parameters())
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # BN running stats too
    assert torch.get_num_threads() == threads and torch.equal(torch.random.get_rng_state(), rng)


def scenario(model: str) -> str:
    return f"""
[topology]
kind = "star"
hosts = 4

[[jobs]]
name = "mine"
scheme = "ring"
model = "{model}"
iterations = 2
workers = "h0..h3"
"""


def test_a_scenario_naming_the_file_simulates(saved, tmp_path, monkeypatch):
    profile, path = saved
    # A scenario file: relative to its own directory, whatever the current directory.
    (tmp_path / "scen").mkdir()
    (tmp_path / "scen" / "net.json").write_text(path.read_text())
    (tmp_path / "scen" / "mine.toml").write_text(scenario("net.json"))
    monkeypatch.chdir(tmp_path)
    job = inalab.simulate("scen/mine.toml").jobs.iloc[0]
    assert job["finished"] and job["iterations"] == 2
    assert job["bytes_per_iteration"] == profile.total_bytes
    # TOML text (or a table): relative to the current directory.
    job = inalab.simulate(scenario("scen/net.json")).jobs.iloc[0]
    assert job["finished"] and job["bytes_per_iteration"] == profile.total_bytes
    # The workload is the profile's, in forward order; send_order takes its layer names.
    spec = load_scenario(scenario(str(path))).to_spec()
    assert spec["jobs"][0]["workload"]["layers"] == profile.to_workload()
    in_order = scenario(str(path)) + 'send_order = ["conv", "fc1", "fc2"]\n'
    assert inalab.simulate(in_order).jobs.iloc[0]["finished"]
    # Catalog names still work.
    assert inalab.simulate(scenario("dnn_b").replace("iterations = 2", "iterations = 1")).jobs.iloc[0]["finished"]


def config_error(model: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        load_scenario(scenario(model))
    assert e.value.field == "jobs[0].model"
    return e.value


def test_missing_or_malformed_profile_names_the_field(tmp_path):
    assert "no profile file" in config_error(str(tmp_path / "nope.json")).message
    assert "nope.json" in config_error(str(tmp_path / "nope.json")).message
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "not valid JSON" in config_error(str(bad)).message
    bad.write_text(json.dumps({"layers": [{"name": "a", "params": -1, "fwd_s": 0.1, "bwd_s": 0.2}]}))
    e = config_error(str(bad))
    assert "bad.json" in e.message and "layers[0].params: must be a positive integer" in e.message
    bad.write_text(json.dumps({"layers": []}))
    assert "layers: must be a non-empty list" in config_error(str(bad)).message
    bad.write_text(json.dumps({"layers": [{"name": "a", "params": 1, "fwd_s": 0.1, "bwd_s": 0.2}], "total_params": 2}))
    assert "total_params" in config_error(str(bad)).message
    assert "allowed values: resnet50" in config_error("resnet9000").message


def test_a_hand_written_profile_needs_only_layers(tmp_path):
    path = tmp_path / "two.json"
    path.write_text(json.dumps({"layers": [{"name": "a", "params": 10, "fwd_s": 1e-4, "bwd_s": 2e-4},
                                           {"name": "b", "params": 20, "fwd_s": 1e-4, "bwd_s": 2e-4}]}))
    m = load_profile(path)
    assert (m.name, m.total_params, m.total_bytes) == ("two", 30, 120)
    assert m.iteration_compute_s == pytest.approx(6e-4)


@pytest.mark.parametrize("kwargs,field", [
    ({"model": "resnet50"}, "model"),
    ({"example_input": 3}, "example_input"),
    ({"path": "out.toml"}, "path"),
    ({"name": ""}, "name"),
    ({"loss_fn": 1}, "loss_fn"),
    ({"group": "leaf"}, "group"),
    ({"group": 0}, "group"),
    ({"warmup": -1}, "warmup"),
    ({"repeat": 0}, "repeat"),
    ({"repeat": 1.5}, "repeat"),
    ({"threads": 0}, "threads"),
    ({"batch_size": 0}, "batch_size"),
    ({"description": 5}, "description"),
    ({"loss_fn": lambda out: out}, "loss_fn"),  # not a scalar
])
def test_bad_arguments_name_themselves(net, x, kwargs, field):
    args = {"model": net, "example_input": x, "warmup": 0, "repeat": 1, **kwargs}
    with pytest.raises(ValueError, match=f"^{field}:"):
        from_torch(**args)


def test_allowed_values_listed():
    with pytest.raises(ValueError) as e:
        from_torch(nn.Linear(2, 2), torch.randn(1, 2), group="leaf")
    assert "'module+norm', 'module' or an integer >= 1" in str(e.value)


def test_parameters_without_gradient_are_an_error(x):
    net = Net()
    net.unused = nn.Linear(3, 3)
    with pytest.raises(ValueError, match=r"^model: .*unused\.weight, unused\.bias.*requires_grad=False"):
        from_torch(net, x, warmup=0, repeat=1)


def test_inputs_as_tuple_and_dict_and_custom_loss():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 4), nn.Linear(5, 4)

        def forward(self, u, v):
            return {"out": self.a(u) + self.b(v), "aux": (u.sum(),)}

    m, u, v = Two(), torch.randn(2, 3), torch.randn(2, 5)
    for inp in ((u, v), {"u": u, "v": v}):
        p = from_torch(m, inp, loss_fn=lambda out: (out["out"] ** 2).mean(), warmup=0, repeat=1)
        assert sorted(l.name for l in p.layers) == ["a", "b"] and p.total_params == numel(m)
