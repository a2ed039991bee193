"""The Java runtime Spark will start: which `java`, and what ``java -version`` says of it. Both the session
(`weirflow.spark.session`, which refuses to start without one) and the class archive (named after the runtime it
belongs to) ask."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

from weirflow.base.errors import JavaMissingError


@functools.lru_cache(maxsize=4)
def java_version_text(java: str) -> str:
    """What ``java -version`` prints (once per process: a JVM start costs a few hundred milliseconds)."""
    return subprocess.run([java, "-version"], capture_output=True, text=True, check=True, timeout=30).stderr


def check_java() -> str:
    """The `java` that Spark will use; raise `JavaMissingError` with the way to install one."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise JavaMissingError(
            "Spark needs a Java runtime (17 or newer) and none was found "
            f"({'JAVA_HOME=' + java_home if java_home else 'no java on PATH'}). Install one, e.g. "
            "`sudo apt-get install default-jre-headless` (Debian/Ubuntu), `brew install openjdk@17` (macOS), "
            "or run `make run`, which installs it when missing."
        )
    try:
        java_version_text(java)
    except (OSError, subprocess.SubprocessError) as exc:
        raise JavaMissingError(f"'{java} -version' failed ({exc}); install a working Java 17+ runtime") from exc
    return java
