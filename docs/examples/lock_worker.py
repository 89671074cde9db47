#!/usr/bin/env python3
"""Work items, one kubelock lock each, through the kubelock agent beside the app.

Standard library only; no Kubernetes knowledge. For each work item the worker
takes the item's lock (waiting in the lock's queue), watches for its loss with
a long poll, does the item's work in steps while it holds the lock, sending
the lock's fencing token with every write, and releases the lock. When the
lock is lost (expired or force-released, or the agent lost its session) the
work on that item stops at the next step, before anyone else can hold it.

Environment:
  KUBELOCK_AGENT  the agent's address (default http://127.0.0.1:8477)
  ITEMS           the work items, one lock each (default "invoice-1 invoice-2 invoice-3")
  STEPS           writes per item (default 3), STEP_SECONDS apart (default 1)
  ROUNDS          passes over the items (default 1; 0: forever)
  STORE_URL       a fenced HTTP store (pkg/fencing's Middleware): each write is
                  POST STORE_URL/ITEM with the lock and its token in headers,
                  and the store refuses a token older than one it accepted;
                  without it, the writes are only printed
"""
import itertools
import json
import os
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request

AGENT = os.environ.get("KUBELOCK_AGENT", "http://127.0.0.1:8477")
ITEMS = os.environ.get("ITEMS", "invoice-1 invoice-2 invoice-3").split()
STEPS = int(os.environ.get("STEPS", "3"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "1"))
ROUNDS = int(os.environ.get("ROUNDS", "1"))
STORE_URL = os.environ.get("STORE_URL")
WRITER = os.environ.get("POD_NAME") or socket.gethostname()


def call(method, url, headers=None, body=None):
    """Sends one request and returns its status and JSON answer, errors too."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=90) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def lock_url(item, action="", **query):
    """The agent's URL of an item's lock: the key is one path segment."""
    key = urllib.parse.quote(item, safe="")
    return f"{AGENT}/v1/locks/{key}{action}?{urllib.parse.urlencode(query)}"


def watch(item, lease_id, lost):
    """Long-polls the agent until the holding ends, then tells the work why."""
    while True:
        status, answer = call("GET", lock_url(item, leaseID=lease_id, wait="60s"))
        if status != 200:  # 404 with the reason: released, expired or lost
            lost["reason"] = answer["reason"]
            lost["event"].set()
            return


def write(item, token, step):
    """One write of the item's work, fenced with the lock's token."""
    if not STORE_URL:
        return True, ""
    headers = {"Kubelock-Lock": item, "Kubelock-Fencing-Token": str(token), "Content-Type": "application/json"}
    body = json.dumps({"writer": WRITER, "step": step}).encode()
    status, answer = call("POST", f"{STORE_URL}/{urllib.parse.quote(item, safe='')}", headers, body)
    return status < 300, answer.get("error", "")


def work(item):
    """Takes the item's lock, does the item's work while it lasts, releases it."""
    status, held = call("POST", lock_url(item, wait="60s", lease="30s"))
    if status != 200:
        print(f"skipped {item}: {held['reason']}: {held['error']}", flush=True)
        return
    token, lease_id = held["fencingToken"], held["leaseID"]
    print(f"took {item} token {token} lease {lease_id}", flush=True)
    lost = {"event": threading.Event(), "reason": ""}
    threading.Thread(target=watch, args=(item, lease_id, lost), daemon=True).start()
    for step in range(STEPS):
        if lost["event"].is_set():
            print(f"lost {item} token {token}: {lost['reason']}", flush=True)
            return
        ok, error = write(item, token, step)
        print(f"{'wrote' if ok else 'refused'} {item} token {token} step {step} {error}".rstrip(), flush=True)
        call("POST", lock_url(item, "/renew", leaseID=lease_id))  # a longer item keeps its lease
        lost["event"].wait(STEP_SECONDS)
    status, answer = call("DELETE", lock_url(item, leaseID=lease_id))
    if status == 200:
        print(f"released {item} token {token}", flush=True)
    else:
        print(f"lost {item} token {token}: {answer['reason']}", flush=True)


def main():
    rounds = itertools.count() if ROUNDS == 0 else range(ROUNDS)
    for _ in rounds:
        for item in ITEMS:
            work(item)


if __name__ == "__main__":
    main()
