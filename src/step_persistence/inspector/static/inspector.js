// The inspector's only script (the Content-Security-Policy allows no inline one).
// - Buttons with data-copy="ID" copy the text of the element with that id.
// - A page whose <main> has data-state-url (a run that has not ended) asks that URL for the run's
//   state every data-refresh-ms; when its fingerprint changes, it fetches the page again and swaps
//   the new <main> in, so the page follows the run without a reload.
(function () {
  'use strict';

  document.addEventListener('click', function (event) {
    var button = event.target.closest('button[data-copy]');
    if (!button) {
      return;
    }
    var source = document.getElementById(button.dataset.copy);
    if (!source || !navigator.clipboard) {
      return;
    }
    navigator.clipboard.writeText(source.textContent).then(function () {
      button.textContent = 'Copied';
    });
  });

  var live = document.querySelector('main[data-state-url]');
  if (!live) {
    return;
  }
  var every = Number(live.dataset.refreshMs) || 2000;

  function schedule() {
    if (live.dataset.running === 'true') {
      window.setTimeout(poll, every);
    }
  }

  function swapIn(html) {
    var fresh = new DOMParser().parseFromString(html, 'text/html').querySelector('main[data-state-url]');
    if (fresh) {
      live.replaceWith(fresh);
      live = fresh;
    }
  }

  function poll() {
    fetch(live.dataset.stateUrl, { credentials: 'same-origin', cache: 'no-store' })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (state) {
        if (!state || state.fingerprint === live.dataset.fingerprint) {
          return null;
        }
        return fetch(window.location.href, { credentials: 'same-origin', cache: 'no-store' })
          .then(function (response) { return response.ok ? response.text() : null; })
          .then(function (html) { if (html) { swapIn(html); } });
      })
      .catch(function () { return null; })
      .then(schedule);
  }

  schedule();
})();
