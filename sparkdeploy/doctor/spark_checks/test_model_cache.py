"""The model cache (the inventory's cluster.hf_cache) is writable by the SSH user: `models pull` and the engine's
downloads land there. Not there yet: its nearest existing folder must be writable, so it can be made."""

from testinfra.host import Host

from sparkdeploy.config.inventory import ClusterSettings


def test_model_cache_writable(host: Host, cluster: ClusterSettings) -> None:
    home = host.check_output('printf %s "$HOME"')
    path = cluster.hf_cache.replace("~", home, 1)
    while not host.file(path).exists:
        path = path.rsplit("/", 1)[0] or "/"
    assert host.file(path).is_directory, f"{path} is not a folder"
    assert host.run("test -w %s", path).rc == 0, f"{path} is not writable by {host.user().name}"
