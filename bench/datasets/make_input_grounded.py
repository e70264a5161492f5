"""Writes input_grounded.jsonl: prompts whose answers quote their input (code edits,
extraction), the workload prompt lookup is for. Run: python3 make_input_grounded.py"""

import json

CODE = [
    ("python", '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result''', "rename the variable `total` to `running_sum`"),
    ("python", '''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def peek(self):
        if not self.items:
            return None
        return self.items[-1]

    def __len__(self):
        return len(self.items)''', "rename the class `Stack` to `LifoQueue`"),
    ("rust", '''fn parse_pairs(input: &str) -> Vec<(String, u32)> {
    let mut pairs = Vec::new();
    for line in input.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            if let Ok(number) = value.trim().parse::<u32>() {
                pairs.push((key.trim().to_string(), number));
            }
        }
    }
    pairs
}''', "rename the function `parse_pairs` to `read_settings`"),
    ("javascript", '''function groupBy(items, keyOf) {
  const groups = {};
  for (const item of items) {
    const key = keyOf(item);
    if (!(key in groups)) {
      groups[key] = [];
    }
    groups[key].push(item);
  }
  return groups;
}

function countBy(items, keyOf) {
  const counts = {};
  for (const item of items) {
    const key = keyOf(item);
    counts[key] = (counts[key] || 0) + 1;
  }
  return counts;
}''', "rename the parameter `keyOf` to `getKey` in both functions"),
    ("python", '''import json

def load_config(path):
    with open(path) as f:
        config = json.load(f)
    config.setdefault("host", "127.0.0.1")
    config.setdefault("port", 8080)
    config.setdefault("workers", 4)
    if config["port"] < 1 or config["port"] > 65535:
        raise ValueError("port out of range")
    return config

def save_config(path, config):
    with open(path, "w") as f:
        json.dump(config, f, indent=2)''', "change the default port from 8080 to 9090"),
    ("c", '''int binary_search(const int *array, int length, int target) {
    int low = 0;
    int high = length - 1;
    while (low <= high) {
        int middle = low + (high - low) / 2;
        if (array[middle] == target) {
            return middle;
        }
        if (array[middle] < target) {
            low = middle + 1;
        } else {
            high = middle - 1;
        }
    }
    return -1;
}''', "rename the variable `middle` to `mid`"),
]

TEXTS = [
    '''The Hubble Space Telescope was launched into low Earth orbit in 1990 and remains in operation. It was not the first space telescope, but it is one of the largest and most versatile. Its four main instruments observe in the ultraviolet, visible and near-infrared regions of the electromagnetic spectrum. Hubble's orbit outside the distortion of Earth's atmosphere allows it to capture extremely high-resolution images with substantially lower background light than ground-based telescopes.''',
    '''Photosynthesis is the process by which green plants and some other organisms use sunlight to synthesize foods from carbon dioxide and water. Photosynthesis in plants generally involves the green pigment chlorophyll and generates oxygen as a byproduct. The process takes place mainly in the leaves, inside organelles called chloroplasts. The light-dependent reactions capture energy from sunlight, and the Calvin cycle uses that energy to build sugars.''',
    '''The Great Wall of China is a series of fortifications that were built across the historical northern borders of ancient Chinese states. Several walls were built from as early as the 7th century BC, and the best-known sections were built by the Ming dynasty between 1368 and 1644. The wall stretches from Dandong in the east to Lop Lake in the west. Its total length, including all its branches, has been measured at about 21,196 kilometres.''',
]


def main():
    lines = []
    for language, code, change in CODE:
        prompt = (f"Repeat the following {language} code exactly, but {change}. "
                  f"Output only the code.\n\n```{language}\n{code}\n```")
        lines.append({"prompt": prompt, "max_tokens": 256})
    for text in TEXTS:
        prompt = f"Copy the following paragraph word for word, then stop.\n\n{text}"
        lines.append({"prompt": prompt, "max_tokens": 160})
    with open("input_grounded.jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
