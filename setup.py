"""The packages the wheel holds, found rather than listed: each room folder installs under the
``craftmd`` namespace (``dataset_builder/`` as ``craftmd.dataset_builder``, ``dataset_builder/medpi/``
as ``craftmd.dataset_builder.medpi``, ...), with every subpackage and data folder below it.

Everything else (metadata, dependencies, the package data) is in ``pyproject.toml``; only this
needs code, because setuptools' declarative ``find`` names what it finds after its folder and
cannot put one folder's packages under another name. A new room is one line of ``ROOMS``; a
new subpackage or data folder needs nothing (``tests/test_packaging.py`` checks that every
tracked file of the rooms is in the wheel).
"""

from setuptools import find_namespace_packages, setup

#: Package name -> its folder in the checkout.
ROOMS = {
    "craftmd": "craftmd",
    "craftmd.dataset_builder": "dataset_builder",
    "craftmd.generation": "generation",
    "craftmd.scoring": "scoring",
    "craftmd.analysis": "analysis",
    "craftmd.cards": "cards",
}


def packages() -> list[str]:
    """Every room and every folder below it whose name can be imported (data folders such as
    ``prompts/craftmd-v1`` ship as their parent's package data)."""
    found = []
    for name, folder in ROOMS.items():
        found.append(name)
        for sub in find_namespace_packages(folder, exclude=["*__pycache__*"]):
            if all(part.isidentifier() for part in sub.split(".")):
                found.append(f"{name}.{sub}")
    return sorted(found)


setup(packages=packages(), package_dir=ROOMS)
