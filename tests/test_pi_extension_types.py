"""The Pi extension (deployments/pi/om-memory.ts) is typed against Pi 1.6.0's published types, with no
`any`: `tsc --noEmit` in strict mode (TypeScript from .ci/pi/node_modules, which `.ci/run` installs
with npm next to Pi), on the package as Pi loads it (its package.json, `"type": "module"`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from pi_rpc import EXTENSION, NODE, PI_HOME, missing

TSC = PI_HOME / "typescript" / "bin" / "tsc"


def _why_not() -> str | None:
    if missing() is not None:
        return missing()
    if not TSC.is_file():
        return f"TypeScript is not installed in {PI_HOME} (run `cd .ci/pi && npm install --no-audit --no-fund`)"
    return None


@pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")
def test_the_extension_type_checks_against_pi_s_published_types(tmp_path):
    package = EXTENSION.parent
    for name in ("om-memory.ts", "package.json"):
        shutil.copy(package / name, tmp_path / name)
    (tmp_path / "node_modules").symlink_to(PI_HOME)  # where Pi's types resolve from, as for a package
    (tmp_path / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {"strict": True, "noEmit": True, "target": "ES2022", "module": "NodeNext",
                            "moduleResolution": "NodeNext", "types": ["node"], "skipLibCheck": True,
                            "noUnusedLocals": True, "noUnusedParameters": True, "noImplicitReturns": True},
        "files": ["om-memory.ts"]}))
    checked = subprocess.run([str(NODE), str(TSC), "-p", "tsconfig.json"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=600)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    manifest = json.loads((package / "package.json").read_text())
    assert manifest["pi"]["extensions"] == ["./om-memory.ts"] and manifest["type"] == "module"


def test_the_extension_says_any_nowhere():
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", EXTENSION.read_text(), flags=re.S)  # comments may say it
    assert not re.search(r":\s*any\b|\bas\s+any\b|<any>|\bany\[\]", code)
