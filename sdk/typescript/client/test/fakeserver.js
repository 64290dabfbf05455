// A scripted fetch for the unit tests: each call is answered by the next handler given.
export function scriptedFetch(handlers) {
  const calls = [];
  const fetch = async (url, init = {}) => {
    const u = new URL(url);
    calls.push({ method: init.method, path: u.pathname, query: Object.fromEntries(u.searchParams), headers: init.headers, body: init.body && JSON.parse(init.body) });
    const h = handlers.shift();
    if (!h) throw new Error(`unexpected call ${init.method} ${u.pathname}${u.search}`);
    const { status = 200, body = {}, headers = {} } = typeof h === 'function' ? h(calls.at(-1)) : h;
    return new Response(typeof body === 'string' ? body : JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });
  };
  return { fetch, calls };
}
