"""Parsers of node tool output: the lab stand-ins' (captured from lab nodes) and the real tools' formats."""

from __future__ import annotations

import textwrap
import time

import pytest

from sparkdeploy.doctor.doctor_run import SCRIPT_PRELUDE
from sparkdeploy.doctor.nccl_probe import busbw_verdict, nccl_transport, parse_nccl_table
from sparkdeploy.doctor.nccl_table import median_at
from sparkdeploy.facts.parsers import (
    number,
    parse_df,
    parse_env_lines,
    parse_ethtool_speed,
    parse_ibv_devinfo,
    parse_ip_json,
    parse_meminfo,
    parse_nvidia_smi_csv,
    parse_ping,
    parse_sections,
    parse_show_gids,
    rocev2_gid_index,
    version_tuple,
)

FIELDS = ["index", "name", "driver_version", "memory.total", "memory.used", "memory.free", "temperature.gpu"]


def test_nvidia_smi_csv_lab_and_real_gb10():
    lab = "0, NVIDIA GB10, 580.95.05, 122570, 0, 122570, 41\n"
    row = parse_nvidia_smi_csv(lab, FIELDS)[0]
    assert row["name"] == "NVIDIA GB10" and row["driver_version"] == "580.95.05"
    assert number(row["memory.total"]) == 122570 and number(row["temperature.gpu"]) == 41
    # A real GB10 has no framebuffer figure: unified memory reads [N/A]; doctor falls back to /proc/meminfo.
    real = "0, NVIDIA GB10, 580.126.09, [N/A], [N/A], [N/A], 47\n"
    row = parse_nvidia_smi_csv(real, FIELDS)[0]
    assert row["memory.total"] is None and row["memory.free"] is None and row["temperature.gpu"] == "47"


def test_nvidia_smi_csv_skips_header_and_noise():
    text = (
        "index, name, driver_version, memory.total [MiB], memory.used [MiB], memory.free [MiB], temperature.gpu\n"
        "nvidia-smi: SIMULATED (sparkdeploy lab stand-in: no such hardware on this node)\n"
        "0, NVIDIA H200, 570.133.20, 143771, 0, 143771, 30\n1, NVIDIA H200, 570.133.20, 143771, 5, 143766, 31\n"
    )
    rows = parse_nvidia_smi_csv(text, FIELDS)
    assert [r["index"] for r in rows] == ["0", "1"]


def test_meminfo():
    mem = parse_meminfo("MemTotal:       125513944 kB\nMemAvailable:   118000000 kB\nHugePages_Total:       0\n")
    assert mem["MemTotal"] == 125513944 * 1024 and mem["HugePages_Total"] == 0


def test_ibv_devinfo_lab(sample):
    devs = parse_ibv_devinfo(sample("ibv_devinfo.lab.txt"))
    assert set(devs) == {"rocep1s0f1", "roceP2p1s0f1"}
    dev = devs["rocep1s0f1"]
    assert dev.active and dev.simulated and dev.ports[1].active_mtu == 4096
    assert dev.ports[1].link_layer == "Ethernet"


def test_ibv_devinfo_real_port_down():
    text = textwrap.dedent("""\
        hca_id:\trocep1s0f1
        \ttransport:\t\t\tInfiniBand (0)
        \tfw_ver:\t\t\t\t28.45.1200
        \tboard_id:\t\t\tNVD0000000033
        \tphys_port_cnt:\t\t\t1
        \t\tport:\t1
        \t\t\tstate:\t\t\tPORT_DOWN (1)
        \t\t\tmax_mtu:\t\t4096 (5)
        \t\t\tactive_mtu:\t\t1024 (3)
        \t\t\tlink_layer:\t\tEthernet
        """)
    dev = parse_ibv_devinfo(text)["rocep1s0f1"]
    assert not dev.active and not dev.simulated
    assert dev.ports[1].state == "PORT_DOWN" and dev.ports[1].active_mtu == 1024 and dev.fw_ver == "28.45.1200"


def test_show_gids_lab(sample):
    entries = parse_show_gids(sample("show_gids.lab.txt"))
    assert len(entries) == 8
    assert rocev2_gid_index(entries, "rocep1s0f1", "172.30.78.11") == 3
    assert rocev2_gid_index(entries, "roceP2p1s0f1", "172.30.78.11") == 3
    assert rocev2_gid_index(entries, "rocep1s0f1", "10.0.0.1") is None
    assert rocev2_gid_index(entries, "mlx5_9", "172.30.78.11") is None


def test_show_gids_real_and_sysfs_fallback_format():
    real = textwrap.dedent("""\
        DEV     PORT    INDEX   GID                                     IPv4            VER     DEV
        ---     ----    -----   ---                                     ------------    ---     ---
        rocep1s0f1      1       0       fe80:0000:0000:0000:4ebb:47ff:fe12:3456                 v1      enp1s0f1np1
        rocep1s0f1      1       1       fe80:0000:0000:0000:4ebb:47ff:fe12:3456                 v2      enp1s0f1np1
        rocep1s0f1      1       2       0000:0000:0000:0000:0000:ffff:c0a8:640a 192.168.100.10          v1      enp1s0f1np1
        rocep1s0f1      1       3       0000:0000:0000:0000:0000:ffff:c0a8:640a 192.168.100.10          v2      enp1s0f1np1
        n_gids_found=4
        """)  # noqa: E501 - show_gids output as the tool prints it
    assert rocev2_gid_index(parse_show_gids(real), "rocep1s0f1", "192.168.100.10") == 3
    # doctor's sysfs fallback prints no IPv4 column: it is derived from the IPv4-mapped GID
    fallback = "rocep1s0f1 1 3 0000:0000:0000:0000:0000:ffff:c0a8:640a v2 enp1s0f1np1\n"
    entry = parse_show_gids(fallback)[0]
    assert entry.ipv4 == "192.168.100.10" and entry.version == "v2" and entry.index == 3


def test_ip_json_lab(sample):
    links = parse_ip_json(sample("ip_addr.lab.json"))
    fabric = links["enp1s0f1np1"]
    assert fabric.mtu == 9000 and fabric.up
    assert "172.30.78.11/24" in fabric.addresses
    down = parse_ip_json(
        '[{"ifname":"enp1s0f1np1","flags":["BROADCAST","MULTICAST"],"mtu":1500,"operstate":"DOWN","addr_info":[]}]'
    )["enp1s0f1np1"]
    assert not down.up and down.mtu == 1500
    assert parse_ip_json("not json") == {}


def test_ethtool_speed(sample):
    assert parse_ethtool_speed(sample("ethtool.lab.txt")) == 200000
    assert parse_ethtool_speed("\tSpeed: 100000Mb/s\n") == 100000
    assert parse_ethtool_speed("\tSpeed: Unknown!\n") is None


def test_ping_outputs(sample):
    good = parse_ping(sample("ping_ok.txt"))
    assert good.ok and good.transmitted == 2 and good.received == 2 and good.rtt_avg_ms is not None
    local = parse_ping(sample("ping_local_error.txt"))
    assert not local.ok and local.errors == 2 and "message too long" in local.local_error
    lost = parse_ping(sample("ping_lost.txt"))
    assert not lost.ok and lost.transmitted == 2
    frag = parse_ping(
        "From 10.0.0.1 icmp_seq=1 Frag needed and DF set (mtu = 1500)\n"
        "2 packets transmitted, 0 received, +2 errors, 100% packet loss, time 1001ms\n"
    )
    assert frag.frag_needed_mtu == 1500 and not frag.ok


def test_df_env_versions():
    df = parse_df("Filesystem 1B-blocks Used Available Capacity Mounted on\n/dev/nvme0n1p2 3936... 1 2 3 1% /\n")
    assert df is None  # a broken number is not a figure
    df = parse_df("Filesystem 1B-blocks Used Available Capacity Mounted on\n/dev/vda 270 31 72 30% /var/lib/docker\n")
    assert df == {"size": 270, "used": 31, "avail": 72, "mount": "/var/lib/docker"}
    env = parse_env_lines("# comment\nNCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1\n\nA=b=c\n")
    assert env == {"NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "A": "b=c"}
    assert version_tuple("20.10.24+dfsg1") == (20, 10, 24, 1) and version_tuple("580.95.05") == (580, 95, 5)


def test_sections_protocol_round_trip():
    import subprocess

    script = SCRIPT_PRELUDE + "sec one echo hello\nsec two sh -c 'echo out; echo err >&2; exit 3'\n"
    out = subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True).stdout
    secs = parse_sections(out)
    assert secs["one"].out == "hello" and secs["one"].rc == 0 and secs["one"].err == ""
    assert secs["two"].out == "out" and secs["two"].err == "err" and secs["two"].rc == 3


def test_facts_run_in_parallel_keep_their_order_and_args():
    """The one facts script (sparkdeploy.facts.script): each fact's command in its own subshell, outputs in the
    order asked, stdout/stderr/exit code per fact, the image references as "$@"."""
    import subprocess

    from sparkdeploy.facts.script import Fact, FactArgs, script

    def keep(f, v):
        pass

    facts = [
        Fact("a", 'sleep 0.2; echo "$sd $hf"', lambda s: s, keep),
        Fact("b", 'echo "$ifaces"; echo oops >&2; false', lambda s: s, keep),
        Fact("c", 'echo "$@"', lambda s: s, keep),
    ]
    args = FactArgs(state_dir="x y", hf_cache="/hf", fabric_ifaces=("e1", "e2"), images=("i1", "i2"))
    started = time.monotonic()
    out = subprocess.run(["bash", "-c", script(facts), "t", *args.argv()], capture_output=True, text=True).stdout
    secs = parse_sections(out)
    assert (secs["a"].out, secs["b"].out, secs["c"].out) == ("x y /hf", "e1,e2", "i1 i2")
    assert (secs["b"].err, secs["b"].rc, secs["a"].rc) == ("oops", 1, 0)
    assert out.index("sparkdeploy-facts@@ a") < out.index("sparkdeploy-facts@@ b")
    assert time.monotonic() - started < 2


def test_nccl_tests_table(sample):
    parsed = parse_nccl_table(sample("nccl_tests_all_reduce.txt"))
    assert [r["size"] for r in parsed["rows"]] == [8, 4096, 268435456]
    big = parsed["rows"][-1]
    assert big["busbw"] == 23.42 and big["time_us"] == 11460.2 and big["wrong"] == 0  # out-of-place group
    assert parsed["avg_busbw"] == 7.8505 and parsed["peak_busbw"] == 23.42


def test_nccl_tests_in_place_group_and_medians(sample):
    parsed = parse_nccl_table(sample("nccl_tests_all_reduce.txt"), group="in-place")
    assert [r["time_us"] for r in parsed["rows"]] == [27.95, 30.88, 11452.9]
    assert parsed["rows"][-1]["busbw"] == 23.44
    cycles = parse_nccl_table(
        "\n".join(
            f"        4096          1024     float     sum      -1    {t:.2f}    0.13    0.13      0    {t + 1:.2f}    "
            "0.13    0.13      0"
            for t in (30.0, 10.0, 20.0, 90.0)
        ),
        group="in-place",
    )  # nccl-tests -N 4
    assert median_at(cycles, 4096, "time_us") == 26.0 and median_at(cycles, 8, "time_us") is None
    with pytest.raises(ValueError):
        parse_nccl_table("", group="both")


def test_probe_table_round_trip():
    from sparkdeploy.doctor.probe.allreduce_probe import format_table

    result = {
        "backend": "nccl",
        "world_size": 2,
        "simulated": False,
        "max_bytes": 2**28,
        "capped_by": None,
        "ranks": [{"rank": 0, "host": "a", "device": "GB10", "torch": "2.11", "nccl": "2.28.9"}],
        "rows": [
            {
                "size": 4096,
                "count": 1024,
                "type": "float",
                "redop": "sum",
                "root": -1,
                "time_us": 18.2,
                "algbw": 0.225,
                "busbw": 0.225,
                "wrong": 0,
            }
        ],
        "avg_busbw": 0.225,
        "peak_busbw": 0.225,
        "lat4k": {"eager_us": 18.2, "graph_us": 45.6, "ratio": 2.505, "graph_calls": 100, "graph_error": None},
    }
    parsed = parse_nccl_table(format_table(result))
    assert parsed["rows"][0]["size"] == 4096 and parsed["rows"][0]["time_us"] == 18.2
    assert parsed["lat4k"] == {"eager_us": 18.2, "graph_us": 45.6, "ratio": 2.5}
    assert parsed["teardown_s"] is None


def test_probe_table_names_each_rows_method():
    from sparkdeploy.doctor.probe.allreduce_probe import METHODS, format_table

    rows = [
        {
            "id": key,
            "mode": key.split()[0],
            "path": key.split()[1],
            "us": us,
            "method": METHODS[key].format(calls=20, replays=20),
        }
        for key, us in (("eager nccl-direct", 7.28), ("eager torch.distributed", 21.52), ("graph nccl-direct", 6.21))
    ]
    result = {
        "backend": "nccl",
        "world_size": 2,
        "simulated": False,
        "max_bytes": 2**30,
        "capped_by": None,
        "sweep_method": "nccl-direct",
        "nccl_direct": {"library": "/x/nvidia/nccl/lib/libnccl.so.2", "version": "2.28.9", "error": None},
        "ranks": [{"rank": 0, "host": "a", "device": "H200", "torch": "2.11", "nccl": "2.28.9"}],
        "rows": [
            {
                "size": 8,
                "count": 2,
                "type": "float",
                "redop": "sum",
                "root": -1,
                "time_us": 11.15,
                "algbw": 0.0,
                "busbw": 0.0,
                "wrong": 0,
            }
        ],
        "lat4k": {"eager_us": 7.28, "graph_us": 6.21, "ratio": 0.853, "graph_calls": 20, "rows": rows},
    }
    text = format_table(result) + "\n# teardown: clean in 0.74 s"
    assert "sweep method: nccl-direct: ncclAllReduce through ctypes" in text and "libnccl.so.2 (NCCL 2.28.9)" in text
    parsed = parse_nccl_table(text)
    assert [(r["id"], r["us"]) for r in parsed["lat4k"]["rows"]] == [
        ("eager nccl-direct", 7.28),
        ("eager torch.distributed", 21.52),
        ("graph nccl-direct", 6.21),
    ]
    assert "nccl-tests -G 20 -n 20" in parsed["lat4k"]["rows"][2]["method"]
    assert parsed["lat4k"]["ratio"] == 0.85 and parsed["teardown_s"] == 0.74


def test_probe_table_host_column_and_python_floor():
    """The probe prints, beside each row, its slowest rank's host time per call, and the python floor above the
    table; both parse back, and nccl-tests' two column groups still parse as before."""
    from sparkdeploy.doctor.probe.allreduce_probe import METHODS, format_table

    row = {"size": 8, "count": 2, "type": "float", "redop": "sum", "root": -1, "time_us": 8.27, "algbw": 0.0}
    result = {
        "backend": "nccl",
        "world_size": 2,
        "simulated": False,
        "max_bytes": 2**30,
        "capped_by": None,
        "line_up": "collective",
        "python_floor_us": 0.57,
        "ranks": [{"rank": 0, "host": "a", "device": "H200", "torch": "2.11", "nccl": "2.28.9"}],
        "rows": [dict(row, busbw=0.0, wrong=0, host_us=7.79, host_max_us=7.95)],
        "lat4k": {
            "eager_us": 6.8,
            "rows": [
                {
                    "id": "eager nccl-direct",
                    "mode": "eager",
                    "path": "nccl-direct",
                    "us": 6.8,
                    "host_us": 6.7,
                    "host_max_us": 6.75,
                    "method": METHODS["eager nccl-direct"],
                }
            ],
        },
    }
    text = format_table(result)
    assert "python floor 0.57 us per call" in text and "one all-reduce of the size on the timed communicator" in text
    parsed = parse_nccl_table(text)
    assert parsed["rows"][0]["time_us"] == 8.27 and parsed["rows"][0]["host_us"] == 7.95  # the slowest rank's
    assert parsed["python_floor_us"] == 0.57
    lat = parsed["lat4k"]["rows"][0]
    assert (lat["us"], lat["host_us"], lat["method"]) == (6.8, 6.75, METHODS["eager nccl-direct"])
    nccl_tests = "8 2 float sum -1 9.52 0.00 0.00 0 8.56 0.00 0.00 0"
    both = parse_nccl_table(nccl_tests, group="in-place")["rows"][0]
    assert (both["time_us"], both["host_us"]) == (8.56, None)


def test_verdicts_and_advice():
    assert busbw_verdict(23.4) == "pass" and busbw_verdict(18.5) == "pass"
    assert busbw_verdict(18.0) == "warn"  # under 80 % of 23 GB/s
    assert busbw_verdict(5.0) == "fail" and busbw_verdict(None) == "fail"  # under 25 %: the ~3 GB/s misconfig
    info = nccl_transport(
        "spark1:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
        "spark1:1:1 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE\n"
        "spark1:1:1 [0] NCCL INFO Using network IB\n"
    )
    assert info == {
        "version": "2.28.9+cuda13.0",
        "network": ["IB"],
        "ib_devices": "[0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE",
    }
    assert nccl_transport("NCCL INFO Using network Socket")["network"] == ["Socket"]


def test_nccl_verdict_rows():
    from sparkdeploy.config.inventory import Node
    from sparkdeploy.doctor.nccl_probe import verdict

    nodes = [
        Node(
            name=f"spark{i}",
            role="head" if i == 1 else "worker",
            mgmt_ip=f"192.0.2.{i}",
            fabric_ip=f"198.51.100.{i}/24",
            fabric_ifaces=["enp1s0f1np1"],
            hcas=["rocep1s0f1", "roceP2p1s0f1"],
        )
        for i in (1, 2)
    ]

    def result(busbw, ratio=None, wrong=0):
        return {
            "ok": True,
            "rows": [{"size": 2**28, "busbw": busbw, "wrong": wrong}],
            "peak_busbw": busbw,
            "lat4k": {"eager_us": 18.2, "graph_us": 18.2 * ratio if ratio else None, "ratio": ratio},
        }

    good = verdict(result(23.4, ratio=2.5), {"spark1": {"network": ["IB"]}}, False, nodes)
    assert good.status == "pass" and "23.40 GB/s at 256 MiB (102%)" in good.measured and "NET/IB" in good.measured
    assert "this cluster wants cut at all-reduce" in good.fix and "45.5 us in a CUDA graph" in good.fix
    assert good.data["graph_advice"]["choice"] == "cut at all-reduce"
    slow = verdict(result(3.1), {"spark1": {"network": ["Socket"]}, "spark2": {"network": ["Socket"]}}, False, nodes)
    assert slow.status == "fail" and "NET/Socket instead of NET/IB" in slow.fix and "MTU 1500" in slow.fix
    twin = verdict(result(15.0), {"spark1": {"network": ["IB"], "ib_devices": "[0]rocep1s0f1:1/RoCE"}}, False, nodes)
    assert twin.status == "warn" and "NCCL opened rocep1s0f1 only" in twin.fix
    sim = verdict(result(0.7), {}, True, nodes)
    assert sim.status == "pass" and sim.simulated and "SIMULATED gloo/CPU" in sim.measured
    assert "not applicable" in sim.expected
    assert verdict(result(23.0, wrong=5), {}, False, nodes).status == "fail"
