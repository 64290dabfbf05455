// Every case of the language-neutral test vectors (sdk/go/platformtoken/testdata/vectors.json, see
// docs/adapter-protocol.md §9): digests, token verifications, refusal markers.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { decodeRequest } from '../src/proto.js';
import { digest, digestInput, DIGEST_DOMAIN } from '../src/digest.js';
import { Verifier, TokenRefusedError, keyId, TOKEN_HEADER } from '../src/token.js';
import { readRefusal, refusalError, refusalStatusBytes, STATUS_DETAILS_KEY } from '../src/refusal.js';

const file = fileURLToPath(new URL('../../../../sdk/go/platformtoken/testdata/vectors.json', import.meta.url));
const vectors = JSON.parse(readFileSync(file, 'utf8'));
const byKind = (k) => vectors.cases.filter((c) => c.kind === k);
const request = (c) => decodeRequest(c.request.type, Buffer.from(c.request.proto_hex, 'hex'));

test('the file: version, domain, header, keys, at least 20 cases', () => {
  assert.equal(vectors.version, 1);
  assert.equal(DIGEST_DOMAIN.toString('hex'), vectors.digest_domain_hex);
  assert.equal(TOKEN_HEADER, vectors.token_header);
  for (const [name, k] of Object.entries(vectors.keys)) {
    assert.equal(keyId(Buffer.from(k.public_key_hex, 'hex')), k.kid, name);
  }
  assert.equal(vectors.cases.length, 61);
});

for (const c of byKind('digest')) {
  test(c.name, () => {
    const req = request(c);
    assert.equal(digestInput(c.request.type, req).toString('hex'), c.expect.digest_input_hex, c.note);
    assert.equal(digest(c.request.type, req), c.expect.digest, c.note);
  });
}

for (const c of byKind('token')) {
  test(c.name, () => {
    const v = new Verifier(c.verifier.audience, c.verifier.public_keys, { now: () => c.now * 1000 });
    const call = { method: c.method, type: c.request.type, request: request(c) };
    for (let i = 1; i < c.presentations; i++) v.verify(c.token, call);
    if (c.expect.ok) {
      assert.ok(v.verify(c.token, call), c.note);
      return;
    }
    assert.throws(() => v.verify(c.token, call), (err) => {
      assert.ok(err instanceof TokenRefusedError);
      assert.equal(err.check, c.expect.check, c.note);
      assert.ok(!err.message.includes(c.token || '\0'), 'the message never quotes the token');
      return true;
    });
  });
}

for (const c of byKind('refusal')) {
  test(c.name, () => {
    const bytes = Buffer.from(c.answer.status_proto_hex, 'hex');
    const got = readRefusal(bytes, c.answer.received_header);
    assert.deepEqual(got, {
      marked: c.expect.marked, check: c.expect.check, problem: c.expect.problem, attemptSpent: c.expect.attempt_spent,
    }, c.note);
    // The marker this SDK answers is built right by construction: byte for byte the reference's.
    if (c.name.startsWith('refusal/valid-') && c.answer.status.details.length === 1) {
      const err = new TokenRefusedError(c.expect.check);
      assert.equal(refusalStatusBytes(err.check, err.message).toString('hex'), c.answer.status_proto_hex);
      const answer = refusalError(err);
      assert.equal(answer.code, 16);
      assert.equal(answer.metadata.get(STATUS_DETAILS_KEY)[0].toString('hex'), c.answer.status_proto_hex);
    }
  });
}
