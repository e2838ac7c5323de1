"""A local stand-in for the Hugging Face Hub's HTTP API: the few endpoints ``huggingface_hub`` calls to create a
dataset repo, list its refs, commit files (pre-upload, YAML check, the NDJSON commit), tag a commit, and list and
download a revision's files (``snapshot_download``). Point the real client at it with ``HF_ENDPOINT``.

Every file is taken as a regular (non-LFS) upload, sent inline in the commit; every request is logged in
``hub.log`` as ``(method, path)`` with the bearer token it carried, so a test sees what was (not) uploaded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # oid -> the tree at that commit
    branches: dict[str, str | None] = field(default_factory=lambda: {"main": None})
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, rev: str) -> str | None:
        rev = unquote(rev)
        if rev in self.branches:
            return self.branches[rev]
        if rev in self.tags:
            return self.tags[rev]
        return rev if rev in self.commits else None


class StandInHub:
    """``with StandInHub() as hub: os.environ["HF_ENDPOINT"] = hub.url``; ``hub.repos`` holds what was pushed."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.log: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                hub._serve(self, "GET")

            def do_HEAD(self):
                hub._serve(self, "HEAD")

            def do_POST(self):
                hub._serve(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandInHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def writes(self) -> list[tuple[str, str]]:
        """The requests that create or change something (repo, files, tags)."""
        return [(m, p) for m, p, _ in self.log if m == "POST" and not p.endswith("/refs") and "validate-yaml" not in p]

    # --- the HTTP side ----------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(h.path)
        token = (h.headers.get("authorization") or "").removeprefix("Bearer ") or None
        body = h.rfile.read(int(h.headers.get("content-length") or 0)) if method == "POST" else b""
        with self._lock:
            self.log.append((method, url.path, token))
            try:
                status, payload, headers = self._route(method, url.path, parse_qs(url.query), body, token)
            except KeyError as exc:
                status, payload, headers = 404, {"error": f"not found: {exc}"}, {"X-Error-Code": "EntryNotFound"}
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        h.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers, "Content-Length": str(len(data))}.items():
            h.send_header(k, v)
        h.end_headers()
        if method != "HEAD":
            h.wfile.write(data)

    def _route(self, method, path, query, body, token):
        if method == "POST" and path == "/api/repos/create":
            if not token:
                return 401, {"error": "Invalid credentials"}, {}
            req = json.loads(body)
            repo_id = f"{req['organization']}/{req['name']}"
            if repo_id in self.repos:
                return 409, {"error": "You already created this dataset repo", "url": f"{self.url}/datasets/{repo_id}"}, {}
            self.repos[repo_id] = Repo()
            return 200, {"url": f"{self.url}/datasets/{repo_id}"}, {}
        if method == "POST" and path == "/api/validate-yaml":
            return 200, {"errors": [], "warnings": []}, {}
        m = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/(refs|preupload|commit|tag|revision|tree)(?:/([^/]+)(/.*)?)?", path)
        if m:
            repo_id, action, rev, rest = m.groups()
            repo = self.repos.get(repo_id)
            if repo is None:
                return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
            if action == "refs":

                def ref(kind, name, oid):
                    return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": oid}

                return (
                    200,
                    {
                        "branches": [ref("heads", b, o) for b, o in repo.branches.items() if o],
                        "tags": [ref("tags", t, o) for t, o in repo.tags.items()],
                        "converts": [],
                        "pullRequests": [],
                    },
                    {},
                )
            if method == "POST" and not token:
                return 401, {"error": "Invalid credentials"}, {}
            if action == "preupload":
                files = json.loads(body)["files"]
                return (
                    200,
                    {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files]},
                    {},
                )
            if action == "commit":
                return self._commit(repo_id, repo, unquote(rev), body)
            if action == "tag":
                tag = json.loads(body)["tag"]
                if tag in repo.tags:
                    return 409, {"error": f"Tag {tag} already exists"}, {}
                oid = repo.resolve(rev)
                if oid is None:
                    return 404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"}
                repo.tags[tag] = oid
                return 200, {}, {}
            oid = repo.resolve(rev)
            if oid is None:
                return 404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"}
            tree = repo.commits[oid]
            if action == "revision":
                return (
                    200,
                    {"id": repo_id, "sha": oid, "private": False, "siblings": [{"rfilename": p} for p in sorted(tree)]},
                    {},
                )
            prefix = unquote(rest or "").strip("/")
            entries = [
                {"type": "file", "path": p, "size": len(d), "oid": git_oid(d)}
                for p, d in sorted(tree.items())
                if not prefix or p.startswith(prefix + "/")
            ]
            return 200, entries, {}
        m = re.fullmatch(r"/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and method in ("GET", "HEAD"):
            repo_id, rev, file = m.groups()
            repo = self.repos.get(repo_id)
            if repo is None:
                return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
            oid = repo.resolve(rev)
            if oid is None:
                return 404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"}
            data = repo.commits[oid].get(unquote(file))
            if data is None:
                return 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"}
            return 200, data, {"Content-Type": "application/octet-stream", "X-Repo-Commit": oid, "ETag": f'"{git_oid(data)}"'}
        return 404, {"error": f"the stand-in does not serve {method} {path}"}, {}

    def _commit(self, repo_id, repo, branch, body):
        lines = [json.loads(x) for x in body.splitlines() if x.strip()]
        header = lines[0]["value"]
        head = repo.branches.get(branch)
        if header.get("parentCommit") and header["parentCommit"] != head:
            return 412, {"error": "A commit has happened since the parent commit"}, {}
        tree = dict(repo.commits[head]) if head else {}
        for item in lines[1:]:
            v = item["value"]
            if item["key"] == "file":
                tree[v["path"]] = base64.b64decode(v["content"])
            elif item["key"] == "deletedFile":
                tree.pop(v["path"], None)
            elif item["key"] == "deletedFolder":
                tree = {p: d for p, d in tree.items() if not p.startswith(v["path"].rstrip("/") + "/")}
            else:
                return 400, {"error": f"the stand-in takes no {item['key']}"}, {}
        oid = hashlib.sha1(
            json.dumps([head, header["summary"], sorted((p, git_oid(d)) for p, d in tree.items())]).encode()
        ).hexdigest()
        repo.commits[oid] = tree
        repo.branches[branch] = oid
        return 200, {"commitUrl": f"{self.url}/datasets/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}, {}
