/* Passkeys in the dashboard (WebAuthn): register one, sign in with one, and sign an approval vote
   with one. Options come from the server as JSON (base64url for binary values); the credential
   goes back as a form field, with the page's CSRF token. Served as a static file (CSP). */
(function () {
  "use strict";

  function fromB64url(text) {
    var b64 = text.replace(/-/g, "+").replace(/_/g, "/");
    while (b64.length % 4) b64 += "=";
    var raw = atob(b64);
    var out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out.buffer;
  }
  function toB64url(buffer) {
    var bytes = new Uint8Array(buffer);
    var raw = "";
    for (var i = 0; i < bytes.length; i++) raw += String.fromCharCode(bytes[i]);
    return btoa(raw).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function creationOptions(json) {
    var o = Object.assign({}, json);
    o.challenge = fromB64url(json.challenge);
    o.user = Object.assign({}, json.user, { id: fromB64url(json.user.id) });
    o.excludeCredentials = (json.excludeCredentials || []).map(function (c) {
      return Object.assign({}, c, { id: fromB64url(c.id) });
    });
    return o;
  }
  function requestOptions(json) {
    var o = Object.assign({}, json);
    o.challenge = fromB64url(json.challenge);
    o.allowCredentials = (json.allowCredentials || []).map(function (c) {
      return Object.assign({}, c, { id: fromB64url(c.id) });
    });
    return o;
  }
  function credentialJSON(cred) {
    var r = cred.response;
    var response = { clientDataJSON: toB64url(r.clientDataJSON) };
    if (r.attestationObject) {
      response.attestationObject = toB64url(r.attestationObject);
      response.transports = r.getTransports ? r.getTransports() : [];
    } else {
      response.authenticatorData = toB64url(r.authenticatorData);
      response.signature = toB64url(r.signature);
      if (r.userHandle) response.userHandle = toB64url(r.userHandle);
    }
    return JSON.stringify({
      id: cred.id, rawId: toB64url(cred.rawId), type: cred.type, response: response,
      authenticatorAttachment: cred.authenticatorAttachment || undefined,
      clientExtensionResults: cred.getClientExtensionResults ? cred.getClientExtensionResults() : {}
    });
  }

  function post(url, form, extra) {
    var body = new FormData(form);
    Object.keys(extra || {}).forEach(function (k) { body.set(k, extra[k]); });
    return fetch(url, { method: "POST", body: body, credentials: "same-origin",
                        headers: { "Accept": "application/json" } })
      .then(function (r) {
        return r.json().catch(function () { return { detail: "the server answered " + r.status }; })
          .then(function (data) { if (!r.ok) throw new Error(data.detail || data.error || String(r.status)); return data; });
      });
  }
  function show(id, message) {
    var el = document.getElementById(id);
    if (!el) return;
    el.textContent = message || "";
    el.hidden = !message;
  }
  function failure(e) {
    if (e && e.name === "NotAllowedError") return "The passkey request was cancelled or timed out.";
    return (e && e.message) || String(e);
  }

  // ---- register: <form id="passkey-register-form" data-options-url data-register-url>
  function register(form) {
    show("passkey-register-error", "");
    form.setAttribute("data-state", "busy");
    post(form.getAttribute("data-options-url"), form)
      .then(function (options) { return navigator.credentials.create({ publicKey: creationOptions(options) }); })
      .then(function (cred) { return post(form.getAttribute("data-register-url"), form, { credential: credentialJSON(cred) }); })
      .then(function () { window.location.reload(); })
      .catch(function (e) { form.setAttribute("data-state", "failed"); show("passkey-register-error", failure(e)); });
  }

  // ---- sign in: <form id="passkey-sign-in-form" data-options-url data-sign-in-url>
  function signIn(form) {
    show("passkey-sign-in-error", "");
    post(form.getAttribute("data-options-url"), form)
      .then(function (options) { return navigator.credentials.get({ publicKey: requestOptions(options) }); })
      .then(function (cred) { return post(form.getAttribute("data-sign-in-url"), form, { credential: credentialJSON(cred) }); })
      .then(function (data) { window.location.assign(data.redirect || "/"); })
      .catch(function (e) { show("passkey-sign-in-error", failure(e)); });
  }

  // ---- an approval vote signed with a passkey: <form data-passkey-vote data-challenge-url>
  // The page shows the action in full before this runs; the server's challenge is bound to it.
  function vote(form, submitter) {
    var errorId = form.getAttribute("data-error-id");
    show(errorId, "");
    var decision = submitter && submitter.name === "decision" ? submitter.value : "";
    var nonce = "";
    post(form.getAttribute("data-challenge-url"), form)
      .then(function (issued) {
        nonce = issued.nonce;
        return navigator.credentials.get({ publicKey: requestOptions(issued.publicKey) });
      })
      .then(function (cred) {
        return post(form.getAttribute("action"), form,
                    { credential: credentialJSON(cred), decision: decision, nonce: nonce });
      })
      .then(function (data) { window.location.assign(data.redirect || window.location.href); })
      .catch(function (e) { show(errorId, failure(e)); });
  }

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (form.id === "passkey-register-form") { ev.preventDefault(); register(form); }
    else if (form.id === "passkey-sign-in-form") { ev.preventDefault(); signIn(form); }
    else if (form.hasAttribute("data-passkey-vote")) { ev.preventDefault(); vote(form, ev.submitter); }
  });
})();
