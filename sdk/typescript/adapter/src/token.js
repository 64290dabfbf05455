// The platform token (docs/adapter-protocol.md §6): an EdDSA JWT bound to one call, verified
// with the checks in the spec's order, each failure named by its check.
import { createHash, createPublicKey, verify as cryptoVerify } from 'node:crypto';
import { digest } from './digest.js';

/** The gRPC metadata key the token travels in. */
export const TOKEN_HEADER = 'integrations-platform-token';
/** Every platform token's iss. */
export const ISSUER = 'integrations-platform';
/** The verifier's allowance for a signer's clock ahead (iat), and the longest life a token has. */
export const SKEW_SECONDS = 30;
export const LIFETIME_SECONDS = 60;

/** The names of the checks a token can fail, as the refusal marker carries them. */
export const Check = Object.freeze({
  MISSING: 'missing', KEY: 'key', INVALID: 'invalid', AUDIENCE: 'audience', BINDING: 'binding', REPLAYED: 'replayed',
});

const messages = {
  missing: 'no platform token',
  key: 'token signed by an unknown key',
  invalid: 'token invalid (malformed, bad signature or expired)',
  audience: 'token is for another adapter',
  binding: 'token is for another call (execution, attempt, method or request)',
  replayed: 'token already used',
};

/** A refused token: check names which check failed; the message never quotes the token. */
export class TokenRefusedError extends Error {
  constructor(check) {
    super(`platform token refused: ${messages[check]}`);
    this.name = 'TokenRefusedError';
    this.check = check;
  }
}

const refuse = (check) => new TokenRefusedError(check);

/** The RFC 7638 JWK thumbprint of a raw 32-byte Ed25519 public key: a token's kid. */
export function keyId(raw) {
  const jwk = `{"crv":"Ed25519","kty":"OKP","x":"${Buffer.from(raw).toString('base64url')}"}`;
  return createHash('sha256').update(jwk, 'utf8').digest('base64url');
}

/**
 * Reads public keys as INTEGRATIONS_PLATFORM_PUBLIC_KEYS gives them: base64 of the 32 raw bytes,
 * comma or white-space separated, or PEM "PUBLIC KEY" blocks. Returns the raw keys.
 */
export function parsePublicKeys(text) {
  text = String(text ?? '').trim();
  const keys = [];
  if (text.startsWith('-----BEGIN')) {
    const blocks = text.match(/-----BEGIN ([A-Z ]+)-----[\s\S]*?-----END \1-----/g) ?? [];
    for (const block of blocks) {
      if (!block.startsWith('-----BEGIN PUBLIC KEY-----')) throw new Error(`public key ${keys.length + 1}: a PEM block other than PUBLIC KEY`);
      const k = createPublicKey(block);
      if (k.asymmetricKeyType !== 'ed25519') throw new Error(`public key ${keys.length + 1}: not an Ed25519 key`);
      keys.push(Buffer.from(k.export({ format: 'jwk' }).x, 'base64url'));
    }
  } else {
    for (const f of text.split(/[,\s]+/).filter(Boolean)) {
      const b = Buffer.from(f, 'base64');
      if (b.length !== 32 || b.toString('base64') !== f.replace(/=*$/, '') + '='.repeat((4 - (f.replace(/=*$/, '').length % 4)) % 4)) {
        throw new Error(`public key ${keys.length + 1}: not the base64 of a 32-byte Ed25519 key`);
      }
      keys.push(b);
    }
  }
  if (keys.length === 0) throw new Error('no public key');
  return keys;
}

const base64url = /^[A-Za-z0-9_-]*$/;

/** Strict base64url without padding: the one spelling of the bytes, or null. */
function decodePart(part) {
  if (!base64url.test(part) || part.length % 4 === 1) return null;
  const b = Buffer.from(part, 'base64url');
  // A last character with unused bits set decodes to the same bytes: refused, so that no second
  // spelling of a token gets past the replay cache.
  return b.toString('base64url') === part ? b : null;
}

function jsonObject(buf) {
  try {
    const v = JSON.parse(buf.toString('utf8'));
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? v : null;
  } catch {
    return null;
  }
}

const isString = (v) => typeof v === 'string';
const isNumber = (v) => typeof v === 'number' && Number.isFinite(v);
// Each claim's JSON type; a claim of another type makes the token invalid.
const claimTypes = {
  iss: isString, sub: isString, jti: isString, rpc: isString, req: isString,
  exp: isNumber, iat: isNumber, nbf: isNumber,
  aud: (v) => isString(v) || (Array.isArray(v) && v.every(isString)),
  att: (v) => Number.isInteger(v) && v >= -2147483648 && v <= 2147483647,
};

/**
 * Verifies platform tokens for one adapter: its audience (the catalog id) and the platform's
 * public keys (several during a rotation, chosen by kid). It keeps the replay cache: the jti of
 * every token accepted, until the token expires.
 */
export class Verifier {
  /**
   * @param {string} audience the adapter's id in the catalog
   * @param {Array<Uint8Array|string>} publicKeys raw 32-byte keys, or text parsePublicKeys reads
   * @param {{now?: () => number}} [opts] now: the clock in milliseconds (tests)
   */
  constructor(audience, publicKeys, opts = {}) {
    if (!audience) throw new Error('platform token verifier: the adapter id (the tokens\' audience) is required');
    const raw = (publicKeys ?? []).flatMap((k) => (typeof k === 'string' ? parsePublicKeys(k) : [Buffer.from(k)]));
    if (raw.length === 0) throw new Error('platform token verifier: at least one platform public key is required');
    this.audience = audience;
    this.keys = new Map();
    for (const k of raw) {
      if (k.length !== 32) throw new Error(`platform token verifier: a public key of ${k.length} bytes, want 32`);
      this.keys.set(keyId(k), createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: k.toString('base64url') }, format: 'jwk' }));
    }
    this.now = opts.now ?? Date.now;
    /** @type {Map<string, number>} jti → until (Unix seconds) */
    this.seen = new Map();
    this.pruned = 0;
  }

  /**
   * Checks token for a call: method is the full gRPC method, type 'ExecuteRequest' or
   * 'CancelRequest', request the request as received (decoded, keepCase). Returns the claims or
   * throws a TokenRefusedError naming the check.
   */
  verify(token, { method, type, request }) {
    // 1. Present.
    if (typeof token !== 'string' || token === '') throw refuse(Check.MISSING);
    // 2. Well formed.
    const parts = token.split('.');
    if (parts.length !== 3) throw refuse(Check.INVALID);
    const [h, c, s] = parts.map(decodePart);
    if (!h || !c || !s) throw refuse(Check.INVALID);
    const header = jsonObject(h);
    const claims = jsonObject(c);
    if (!header || !claims || header.alg !== 'EdDSA') throw refuse(Check.INVALID);
    for (const [name, ok] of Object.entries(claimTypes)) {
      if (claims[name] !== undefined && claims[name] !== null && !ok(claims[name])) throw refuse(Check.INVALID);
    }
    // 3. A key held.
    const key = typeof header.kid === 'string' ? this.keys.get(header.kid) : undefined;
    if (!key) throw refuse(Check.KEY);
    // 4. The signature, over the ASCII bytes of the first two parts.
    if (s.length !== 64 || !cryptoVerify(null, Buffer.from(`${parts[0]}.${parts[1]}`, 'ascii'), key, s)) {
      throw refuse(Check.INVALID);
    }
    // 5. Claims; the audience first.
    const now = this.now() / 1000;
    const aud = typeof claims.aud === 'string' ? [claims.aud] : claims.aud ?? [];
    if (!aud.includes(this.audience)) throw refuse(Check.AUDIENCE);
    if (!isNumber(claims.exp) || now >= claims.exp) throw refuse(Check.INVALID);
    if (isNumber(claims.nbf) && now < claims.nbf) throw refuse(Check.INVALID);
    if (claims.iss !== ISSUER) throw refuse(Check.INVALID);
    // 6. Bound to this call, before the replay cache: a forged request does not use up the token.
    if ((claims.sub ?? '') !== (request?.execution_id ?? '') || (claims.att ?? 0) !== (request?.attempt ?? 0) || (claims.rpc ?? '') !== method) {
      throw refuse(Check.BINDING);
    }
    if (!claims.req || claims.req !== digest(type, request ?? {})) throw refuse(Check.BINDING);
    // 7. Id, issue time, lifetime.
    if (!claims.jti || !isNumber(claims.iat)) throw refuse(Check.INVALID);
    if (claims.iat > now + SKEW_SECONDS || claims.exp - claims.iat > LIFETIME_SECONDS + SKEW_SECONDS) {
      throw refuse(Check.INVALID);
    }
    // 8. First use.
    if (!this.#firstUse(claims.jti, claims.exp, now)) throw refuse(Check.REPLAYED);
    return claims;
  }

  #firstUse(jti, exp, now) {
    if (now - this.pruned >= 1) {
      for (const [id, until] of this.seen) if (now > until) this.seen.delete(id);
      this.pruned = now;
    }
    const until = this.seen.get(jti);
    if (until !== undefined && now <= until) return false;
    // Kept past exp as the Go SDK does; an expired token is refused anyway.
    this.seen.set(jti, exp + SKEW_SECONDS);
    return true;
  }
}
