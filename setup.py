"""Ship the top-level recipes/, templates/ and images/ inside the wheel as sparkdeploy/data/.

The checkout keeps them at the top level where people edit them; an installed copy finds them under
sparkdeploy/data (see sparkdeploy/paths.py).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA_DIRS = ("recipes", "templates", "images")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "wheels", "downloads", "*.egg-info")


class BuildWithData(build_py):
    def run(self):
        super().run()
        root = Path(__file__).parent
        target = Path(self.build_lib) / "sparkdeploy" / "data"
        for name in DATA_DIRS:
            if (root / name).is_dir():
                shutil.rmtree(target / name, ignore_errors=True)
                shutil.copytree(root / name, target / name, ignore=SKIP)


setup(cmdclass={"build_py": BuildWithData})
