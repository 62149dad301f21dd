// A real OpenID Connect provider for the sign-in tests: the npm package
// oidc-provider, with a login form that checks passwords and a consent step that
// grants what the client asked (a first-party client, as a university's is).
//
//   node tests/oidc/provider.mjs PORT ACCOUNTS_JSON CLIENTS_JSON
//
// ACCOUNTS_JSON is read again at every lookup, so a test changes someone's groups
// or e-mail by rewriting it: {"SUB": {"login", "password", "email",
// "preferred_username", "groups": [...]}}. CLIENTS_JSON is oidc-provider's client
// metadata list. Prints "ready ISSUER" once it listens.
import { readFileSync } from 'node:fs';
import http from 'node:http';
import Provider from 'oidc-provider';

const [port, accountsFile, clientsFile] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;
const accounts = () => JSON.parse(readFileSync(accountsFile, 'utf8'));
const ttl = Number(process.env.OIDC_ACCESS_TOKEN_TTL || 3600);

const provider = new Provider(issuer, {
  clients: JSON.parse(readFileSync(clientsFile, 'utf8')),
  cookies: { keys: ['gpulease-test-provider-cookie-key'] },
  scopes: ['openid', 'offline_access', 'email', 'profile', 'groups'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['preferred_username', 'name'],
    groups: ['groups'],
  },
  // claims in the ID token too, as Entra ID puts groups there (userdata_from_id_token)
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: false }, rpInitiatedLogout: { enabled: true } },
  ttl: { AccessToken: ttl, IdToken: Number(process.env.OIDC_ID_TOKEN_TTL || 3600),
         Session: 3600, Interaction: 600, Grant: 3600 },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, sub) {
    const account = accounts()[sub];
    if (!account) return undefined;
    return {
      accountId: sub,
      async claims() {
        const now = accounts()[sub] || {};
        const claims = { sub, groups: now.groups || [] };
        if (now.email) Object.assign(claims, { email: now.email, email_verified: true });
        if (now.preferred_username) claims.preferred_username = now.preferred_username;
        if (now.name) claims.name = now.name;
        return claims;
      },
    };
  },
});

const escape = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const page = (uid, error) => `<!doctype html><html><head><title>Test provider: sign in</title></head>
<body><h1>Sign in to the test provider</h1>${error ? `<p class="error">${escape(error)}</p>` : ''}
<form method="post" action="/interaction/${escape(uid)}/login">
<label>Login <input name="login" autofocus></label>
<label>Password <input name="password" type="password"></label>
<button type="submit">Sign in</button></form></body></html>`;

async function readForm(req) {
  let body = '';
  for await (const chunk of req) body += chunk;
  return Object.fromEntries(new URLSearchParams(body));
}

async function interaction(req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  const { prompt, params, session } = details;
  if (prompt.name === 'login' && action === 'login' && req.method === 'POST') {
    const { login, password } = await readForm(req);
    const found = Object.entries(accounts()).find(([, a]) => a.login === login);
    if (!found || found[1].password !== password) {
      res.writeHead(200, { 'content-type': 'text/html' });
      return res.end(page(uid, 'Wrong login or password.'));
    }
    return provider.interactionFinished(req, res, { login: { accountId: found[0] } },
                                        { mergeWithLastSubmission: false });
  }
  if (prompt.name === 'login') {
    res.writeHead(200, { 'content-type': 'text/html' });
    return res.end(page(uid));
  }
  // consent: grant what was asked
  const grant = details.grantId ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(' '));
  if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
  for (const [indicator, scopes] of Object.entries(prompt.details.missingResourceScopes || {})) {
    grant.addResourceScope(indicator, scopes.join(' '));
  }
  const grantId = await grant.save();
  return provider.interactionFinished(req, res, { consent: { grantId } },
                                      { mergeWithLastSubmission: true });
}

const callback = provider.callback();
const server = http.createServer(async (req, res) => {
  const match = req.url.match(/^\/interaction\/([^/?]+)(?:\/(login))?/);
  if (!match) return callback(req, res);
  try {
    await interaction(req, res, match[1], match[2]);
  } catch (err) {
    res.writeHead(400, { 'content-type': 'text/plain' });
    res.end(`interaction failed: ${err.message}`);
  }
});
server.listen(Number(port), '127.0.0.1', () => console.log(`ready ${issuer}`));
process.on('SIGTERM', () => server.close(() => process.exit(0)));
