window.addEventListener('load', function () {
  var n = 0;
  document.querySelectorAll('img.figure').forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { n += 1; }
  });
  document.body.setAttribute('data-figures-loaded', String(n));
});
