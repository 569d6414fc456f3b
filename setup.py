"""The daemon's wheel (mfu-exporter) leaves out the modules of the client distribution (mfu-exporter-client, built
from clients/python), which it requires at its own version: both install into one mfu_exporter directory, and a file
shipped by two distributions would be overwritten by one and deleted by the other's uninstall. The sdist keeps them
(MANIFEST.in), since a wheel is built from it. Everything else is in pyproject.toml."""

from setuptools import setup
from setuptools.command.build_py import build_py

CLIENT_MODULES = {"__init__", "client", "client_http", "jobname"}  # as clients/python/mfu_exporter/ links them


class DaemonModules(build_py):
    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        if package != "mfu_exporter":
            return modules
        return [(pkg, module, path) for pkg, module, path in modules if module not in CLIENT_MODULES]


setup(cmdclass={"build_py": DaemonModules})
