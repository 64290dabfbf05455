// The request digest (docs/adapter-protocol.md §7): SHA-256 over DOMAIN and a canonical encoding
// of the decoded request's fields, never over protobuf or JSON bytes.
import { createHash } from 'node:crypto';
import { kindOf, member } from './struct.js';

/** The 38 bytes every digest's input starts with: the name and a NUL. */
export const DIGEST_DOMAIN = Buffer.from('integrations.platformtoken.request.v1\0', 'latin1');

/** Collects the encoding's bytes. */
class Encoder {
  constructor() { this.parts = [DIGEST_DOMAIN]; }
  tag(c) { this.parts.push(Buffer.from([typeof c === 'number' ? c : c.charCodeAt(0)])); }
  u64(n) {
    const b = Buffer.alloc(8);
    b.writeBigUInt64BE(BigInt.asUintN(64, BigInt(n)));
    this.parts.push(b);
  }
  int(n) { this.tag('i'); this.u64(n); }
  bytes(buf) { this.tag('s'); this.u64(buf.length); this.parts.push(buf); }
  str(s) { this.bytes(Buffer.from(s ?? '', 'utf8')); }
  time(t) {
    if (t === undefined || t === null) { this.tag('-'); return; }
    this.tag('t');
    this.u64(BigInt(t.seconds ?? 0));
    this.u64(BigInt(t.nanos ?? 0));
  }
  struct(s) {
    const fields = s?.fields ?? {};
    // Keys in the order of their UTF-8 bytes: compare Buffers, never JavaScript strings (UTF-16).
    const keys = Object.keys(fields).map((k) => [Buffer.from(k, 'utf8'), k]).sort((a, b) => Buffer.compare(a[0], b[0]));
    this.tag('m');
    this.u64(keys.length);
    for (const [raw, k] of keys) {
      this.bytes(raw);
      this.value(fields[k]);
    }
  }
  value(v) {
    switch (kindOf(v)) {
      case 'null_value': this.tag('n'); break;
      case 'bool_value': this.tag('b'); this.tag(member(v, 'bool_value') ? 1 : 0); break;
      case 'number_value': {
        const b = Buffer.alloc(8);
        b.writeDoubleBE(member(v, 'number_value'));
        this.tag('f');
        this.parts.push(b);
        break;
      }
      case 'string_value': this.str(member(v, 'string_value')); break;
      case 'struct_value': this.struct(member(v, 'struct_value')); break;
      case 'list_value': {
        const values = member(v, 'list_value')?.values ?? [];
        this.tag('l');
        this.u64(values.length);
        for (const e of values) this.value(e);
        break;
      }
      default: this.tag('0');
    }
  }
  done() { return Buffer.concat(this.parts); }
}

/**
 * The bytes hashed for a request as proto-loader decodes it (keepCase), type 'ExecuteRequest' or
 * 'CancelRequest': DOMAIN and the encoding. Compare these first when a digest disagrees.
 */
export function digestInput(type, req) {
  const e = new Encoder();
  if (type === 'ExecuteRequest') {
    e.tag('E');
    e.str(req.execution_id);
    e.int(req.attempt ?? 0);
    e.str(req.capability);
    e.struct(req.payload);
    e.time(req.deadline_time);
    e.bytes(createHash('sha256').update(Buffer.from(req.callback_token ?? '', 'utf8')).digest());
    e.int(req.mode ?? 0);
    e.time(req.deadline_in);
  } else if (type === 'CancelRequest') {
    e.tag('C');
    e.str(req.execution_id);
    e.int(req.attempt ?? 0);
  } else {
    throw new Error(`request digest: a ${type} is not a request to an adapter`);
  }
  return e.done();
}

/** The req claim for a request: base64url, unpadded, of the SHA-256 of digestInput. */
export function digest(type, req) {
  return createHash('sha256').update(digestInput(type, req)).digest('base64url');
}
