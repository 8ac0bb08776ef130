"""Settings of the ``openai`` backend checked when a scenario loads, before any request is
sent: a served model name, an endpoint, and never a key in the file.

Kept apart from :mod:`marl.policies.api` so that validating a scenario does not import the
HTTP client (an optional extra).
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from marl.errors import MarlError, Problem
from orchestration.hints import listing

if TYPE_CHECKING:
    from marl.scenario import PolicySpec
    from marl.team import Team

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: How keys of well-known providers begin (OpenAI, Groq, Hugging Face, xAI, Google, ...).
KEY_PREFIXES = ("sk-", "sk_", "gsk_", "hf_", "xai-", "pplx-", "AIza", "ghp_", "github_pat_")


def looks_like_secret(value: str) -> bool:
    """Whether ``value`` looks like a key rather than the name of an environment variable:
    a provider's key prefix, or a long token mixing upper case, lower case and digits.

    >>> looks_like_secret("sk-proj-4f9a"), looks_like_secret("OPENAI_API_KEY")
    (True, False)
    >>> looks_like_secret("aZ3" * 10), looks_like_secret("MY_VERY_LONG_SERVICE_KEY_NAME_2")
    (True, False)
    """
    if value.startswith(KEY_PREFIXES):
        return True
    return len(value) >= 24 and any(c.isdigit() for c in value) and any(
        c.islower() for c in value) and any(c.isupper() for c in value)


def check_api_fields(path: str, spec: PolicySpec) -> list[Problem]:
    """The problems of an API policy's settings; ``path`` is its key path."""
    out = []
    if spec.model is None:
        out.append(Problem(f"{path}.model", "the openai backend needs `model`: the name the "
                           "server serves the model under (e.g. gpt-4o-mini, or the name "
                           "given to `vllm serve`)."))
    if spec.base_url is None:
        out.append(Problem(f"{path}.base_url", "the openai backend needs `base_url`: the "
                           "endpoint's URL up to /v1, e.g. http://127.0.0.1:8000/v1."))
    elif not spec.base_url.startswith(("http://", "https://")):
        out.append(Problem(f"{path}.base_url", f"{spec.base_url!r} is not an http(s) URL; "
                           "write it in full, e.g. http://127.0.0.1:8000/v1."))
    key_env = spec.api_key_env
    if (key_env is not None and spec.base_url is not None and not spec.allow_plain_http
            and not secure_endpoint(spec.base_url)):
        out.append(Problem(f"{path}.base_url", f"{spec.base_url!r} is plain http to a host "
                           "other than this machine, so the key in api_key_env would cross "
                           "the network unencrypted. Use https, or a loopback address "
                           "(127.0.0.1, localhost, an SSH tunnel), or set "
                           "allow_plain_http: true if the network is trusted."))
    if key_env is not None and looks_like_secret(key_env):
        # Never echo the value: it may be a live key (and error output ends up in logs).
        out.append(Problem(f"{path}.api_key_env", f"this looks like a key ({key_env[:3]}…), "
                           "not the name of an environment variable. A key must not be "
                           "written in a scenario file (every run directory keeps a copy); "
                           "put it in an environment variable (export OPENAI_API_KEY=...) "
                           "and name that variable here (api_key_env: OPENAI_API_KEY)."))
    elif key_env is not None and not ENV_NAME.match(key_env):
        out.append(Problem(f"{path}.api_key_env", f"{key_env!r} is not an environment "
                           "variable name (letters, digits and '_', not starting with a "
                           "digit), e.g. OPENAI_API_KEY."))
    return out


def secure_endpoint(url: str) -> bool:
    """Whether a key sent to ``url`` stays private: https, or http to this machine.

    >>> [secure_endpoint(u) for u in ("https://api.x.ai/v1", "http://127.0.0.1:8000/v1",
    ...                               "http://localhost/v1", "http://10.0.0.5:8000/v1")]
    [True, True, True, False]
    """
    parts = urlsplit(url)
    if parts.scheme == "https":
        return True
    host = parts.hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key(spec: PolicySpec) -> str | None:
    """The key from the environment variable ``spec.api_key_env`` names (None without one:
    local servers need none)."""
    if spec.api_key_env is None:
        return None
    value = os.environ.get(spec.api_key_env)
    if not value:
        raise MarlError(f"api_key_env names the environment variable {spec.api_key_env!r}, "
                        f"which is not set (or empty); export {spec.api_key_env}=<your key> "
                        "before the run, or remove api_key_env for a server that needs no "
                        "key.")
    return value


def refuse_training(team: Team) -> None:
    """API policies are evaluation-only: their weights live on someone else's server, and
    a team that mixes them with trainable agents would pay per token for every training
    episode. Checked before any policy is built."""
    from marl.policies import API_BACKENDS

    api = [name for name, spec in team.scenario.policies.items()
           if spec.backend in API_BACKENDS]
    if api:
        which = f"policies {listing(api)} use" if len(api) > 1 else f"policy {api[0]!r} uses"
        raise MarlError(f"{team.source or team.name}: {which} the "
                        f"{team.scenario.policies[api[0]].backend} backend, which serves "
                        "models over an API and cannot be trained; evaluate such teams with "
                        "marl run, marl sweep or marl analyze, and train tiny or hf policies.")
