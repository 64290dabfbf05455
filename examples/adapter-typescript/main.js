// A minimal adapter on @integrations/adapter. It serves one capability, greeter.greet:
//   sync  — answers {greeting} within the call;
//   async — answers Accepted, reports progress `steps` times through the callbacks (one step
//           every step_ms), and completes with {greeting, steps}.
// Configuration, from the environment (README.md says where each value comes from):
//   ADAPTER_ADDR                      where to listen (default 127.0.0.1:9097)
//   ADAPTER_ID                        this adapter's id in the catalog (default greeter)
//   ADAPTER_CREDENTIAL                its credential in the catalog, sent on every callback
//   INTEGRATIONS_PLATFORM_PUBLIC_KEYS the platform's public key(s): every call must be signed
//   INTEGRATIONS_CALLBACK_ADDR        the adapter-callback service (default 127.0.0.1:9093)
//   INTEGRATIONS_CALLBACK_CA_FILE     a CA file when the callback service serves TLS
import { setTimeout as pause } from 'node:timers/promises';
import { serve, accepted, fail, FailureClass } from '@integrations/adapter';

const env = process.env;

const greet = async (ctx, payload) => {
  if (typeof payload.name !== 'string' || payload.name === '') {
    return fail({ class: FailureClass.PERMANENT, code: 'greeter.bad_request', message: 'payload.name (a string) is required' });
  }
  const greeting = `Hello, ${payload.name}!`;
  if (ctx.mode === 'sync') return { greeting };
  const steps = Number.isInteger(payload.steps) ? payload.steps : 3;
  const stepMs = Number.isFinite(payload.step_ms) ? payload.step_ms : 200;
  // Long work: the SDK answers Accepted now, renews the lease while this runs, and delivers
  // what it returns through the Complete callback.
  return accepted(async (work) => {
    for (let step = 1; step <= steps; step++) {
      await pause(stepMs, undefined, { signal: work.signal });
      await work.reportProgress({ step, of: steps });
    }
    return { greeting, steps };
  }, { leaseMs: 30_000 });
};

if (!env.INTEGRATIONS_PLATFORM_PUBLIC_KEYS) {
  console.error('adapter-typescript: INTEGRATIONS_PLATFORM_PUBLIC_KEYS is required (the platform\'s public key, base64)');
  process.exit(2);
}

const adapter = await serve({
  address: env.ADAPTER_ADDR || '127.0.0.1:9097',
  adapterId: env.ADAPTER_ID || 'greeter',
  publicKeys: [env.INTEGRATIONS_PLATFORM_PUBLIC_KEYS],
  credential: env.ADAPTER_CREDENTIAL,
  callbackAddr: env.INTEGRATIONS_CALLBACK_ADDR || '127.0.0.1:9093',
  callbackCaFile: env.INTEGRATIONS_CALLBACK_CA_FILE || undefined,
  capabilities: { 'greeter.greet': greet },
});

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.once(signal, async () => {
    await adapter.close({ graceMs: 5000 });
    process.exit(0);
  });
}
