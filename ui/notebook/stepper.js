// The Stepper's face in a notebook (anywidget): the prompt, Step / Back / Reset, the sampler's
// sliders, and the generation as the Python side draws it. Every number comes from Python (the
// engine); this file only sends what was pressed and shows what came back.

const SLIDERS = [
  ["temperature", "temperature (0 = greedy)", 0, 2, 0.05],
  ["top_k", "top-k (0 = off)", 0, 100, 1],
  ["top_p", "top-p (1 = off)", 0, 1, 0.01],
  ["min_p", "min-p (0 = off)", 0, 1, 0.01],
];

function slider(model, id, [name, label, min, max, step]) {
  const box = document.createElement("div");
  box.className = "tbt-slider";
  box.innerHTML = `<label for="${id}-${name}">${label}</label>
    <input type="range" id="${id}-${name}" min="${min}" max="${max}" step="${step}">
    <output for="${id}-${name}"></output>`;
  const input = box.querySelector("input");
  const shown = box.querySelector("output");
  const show = () => { input.value = model.get(name); shown.textContent = model.get(name); };
  input.addEventListener("input", () => { shown.textContent = input.value; });
  input.addEventListener("change", () => { model.set(name, Number(input.value)); model.save_changes(); });
  model.on(`change:${name}`, show);
  show();
  return box;
}

function render({ model, el }) {
  const id = `tbt-${Math.random().toString(36).slice(2, 9)}`;
  el.classList.add("tbt-stepper");
  // focusable as a whole, so a click anywhere on it gives it the keys (a remote's PageDown too)
  el.tabIndex = 0;
  el.setAttribute("role", "group");
  el.setAttribute("aria-label", "Token by Token stepper: Step with → or PageDown, Back with ← or PageUp");
  el.innerHTML = `
    <div class="tbt-controls">
      <label for="${id}-prompt">Prompt</label>
      <textarea id="${id}-prompt" rows="2"></textarea>
      <div class="tbt-buttons">
        <button data-do="step" title="Make the next token (→ or PageDown)">Step</button>
        <button data-do="back" title="Take the last token back (← or PageUp)">Back</button>
        <button data-do="reset" title="Start again from the prompt">Reset</button>
        <span class="tbt-status" role="status" aria-live="polite"></span>
      </div>
      <div class="tbt-sliders"></div>
    </div>
    <div class="tbt-view"></div>`;
  const prompt = el.querySelector("textarea");
  const status = el.querySelector(".tbt-status");
  const view = el.querySelector(".tbt-view");
  const sliders = el.querySelector(".tbt-sliders");
  for (const spec of SLIDERS) sliders.appendChild(slider(model, id, spec));

  const press = (what) => model.send({ do: what });
  for (const button of el.querySelectorAll("button")) {
    button.addEventListener("click", () => press(button.dataset.do));
  }
  prompt.addEventListener("change", () => { model.set("prompt", prompt.value); model.save_changes(); });
  // a presenter's remote sends PageDown / PageUp; the arrows when no field has the keys
  el.addEventListener("keydown", (event) => {
    if (event.target.matches("textarea, input")) return;
    const what = { ArrowRight: "step", PageDown: "step", ArrowLeft: "back", PageUp: "back" }[event.key];
    if (what) { event.preventDefault(); press(what); }
  });

  const draw = () => {
    prompt.value = model.get("prompt");
    view.innerHTML = model.get("view");
    status.textContent = model.get("status");
    el.classList.toggle("tbt-busy", model.get("busy"));
  };
  for (const name of ["prompt", "view", "status", "busy"]) model.on(`change:${name}`, draw);
  draw();
}

export default { render };
