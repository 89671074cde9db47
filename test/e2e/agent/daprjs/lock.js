// Drives the kubelock agent with Dapr's official JavaScript SDK, unchanged,
// as an app written for Dapr does: DAPR_HTTP_PORT points the SDK at the
// agent. It prints one JSON line per step ({"step": NAME, ...the SDK's
// answer}); test/e2e/agent's dapr_test.go checks them against the locks.
//
// Environment: DAPR_HTTP_PORT (the agent's port), STORE (a lock store name
// the agent serves), RESOURCE (the lock's key).
"use strict";

const { DaprClient, CommunicationProtocolEnum, LogLevel } = require("@dapr/dapr");

const store = process.env.STORE;
const resource = process.env.RESOURCE;

function step(name, answer) {
  console.log(JSON.stringify({ step: name, ...answer }));
}

async function main() {
  const client = new DaprClient({
    daprHost: "127.0.0.1",
    daprPort: process.env.DAPR_HTTP_PORT,
    communicationProtocol: CommunicationProtocolEnum.HTTP,
    logger: { level: LogLevel.Error }, // stdout is the steps'
  });
  await client.start(); // waits for the sidecar as the SDK does: its metadata
  step("healthy", { healthy: await client.health.isHealthy() });

  step("lock", await client.lock.lock(store, resource, "owner-a", 60));
  step("lock-other-owner", await client.lock.lock(store, resource, "owner-b", 60));
  step("lock-same-owner", await client.lock.lock(store, resource, "owner-a", 60));
  step("unlock-wrong-owner", await client.lock.unlock(store, resource, "owner-b"));
  step("unlock", await client.lock.unlock(store, resource, "owner-a"));
  step("unlock-again", await client.lock.unlock(store, resource, "owner-a"));

  // Expiry: owner-a's lock lapses after expiryInSeconds, never renewed; until
  // then owner-b is refused, after it owner-b takes the lock.
  step("lock-expiring", await client.lock.lock(store, resource, "owner-a", 2));
  step("lock-before-expiry", await client.lock.lock(store, resource, "owner-b", 60));
  const started = Date.now();
  let answer = { success: false };
  let tries = 0;
  while (!answer.success && Date.now() - started < 30000) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    answer = await client.lock.lock(store, resource, "owner-b", 60);
    tries++;
  }
  step("lock-after-expiry", { ...answer, tries, waitedMs: Date.now() - started });
  step("unlock-expired", await client.lock.unlock(store, resource, "owner-a"));
  step("unlock-after-expiry", await client.lock.unlock(store, resource, "owner-b"));

  // A store the agent does not serve is Dapr's ERR_LOCK_STORE_NOT_FOUND.
  try {
    await client.lock.lock("no-such-store", resource, "owner-a", 60);
    step("unknown-store", { thrown: false });
  } catch (e) {
    step("unknown-store", { thrown: true, error: JSON.parse(e.message) });
  }
  await client.stop();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
