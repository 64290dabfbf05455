// serve() on a real port: a call without the platform's token is refused with the marker, as the
// platform reads it, and without the integrations-received header.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import grpc from '@grpc/grpc-js';
import { serve, readRefusal, STATUS_DETAILS_KEY, RECEIVED_HEADER } from '../src/index.js';
import { adapterPackage } from '../src/proto.js';

test('a call without a token: UNAUTHENTICATED with the marker, before integrations-received', async (t) => {
  let ran = false;
  const adapter = await serve({
    adapterId: 'greeter', publicKeys: ['A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg='], logLevel: 'error',
    capabilities: { 'greeter.greet': async () => { ran = true; return {}; } },
  });
  t.after(() => adapter.close({ graceMs: 0 }));
  const Client = grpc.loadPackageDefinition(adapterPackage()).integrations.adapter.v1.AdapterService;
  const client = new Client(adapter.address, grpc.credentials.createInsecure());
  t.after(() => client.close());
  let header;
  const err = await new Promise((resolve) => {
    const call = client.Execute({ execution_id: 'e', attempt: 1, capability: 'greeter.greet' }, (e) => resolve(e));
    call.on('metadata', (md) => { header = md; });
  });
  assert.equal(err.code, grpc.status.UNAUTHENTICATED);
  const received = (header?.get(RECEIVED_HEADER) ?? []).length > 0;
  assert.equal(received, false);
  assert.deepEqual(readRefusal(err.metadata.get(STATUS_DETAILS_KEY)[0], received),
    { marked: true, check: 'missing', problem: '', attemptSpent: false });
  assert.equal(ran, false, 'nothing ran');
});
