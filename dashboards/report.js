window.addEventListener('load', function () {
  var n = 0;
  document.querySelectorAll('img.figure').forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { n += 1; }
  });
  document.body.setAttribute('data-figures-loaded', String(n));
  // What a reader sees without scrolling (read by the headless-browser test), and how
  // many green PASS badges the page shows.
  var seen = [];
  ['why', 'first-witness'].forEach(function (name) {
    var el = document.getElementById(name) || document.querySelector('.' + name);
    if (el) {
      var r = el.getBoundingClientRect();
      if (r.top >= 0 && r.bottom <= window.innerHeight) { seen.push(name); }
    }
  });
  document.body.setAttribute('data-first-screen', seen.join(' '));
  document.body.setAttribute('data-pass-badges', String(document.querySelectorAll('.verdict.pass').length));
});
